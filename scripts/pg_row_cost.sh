#!/bin/bash
# What PostgreSQL spends per written row of `jobs`, without a client: migrates a fresh schema
# of the test database with BINARY, runs SQL (say, dropping an index) on it, then inserts
# 100,000 plain jobs in one statement and, in one transaction each, claims them and completes
# them in statements of 100 rows. Prints the milliseconds of the three phases (insert, claim,
# completion); the schema is dropped after.
#
#     scripts/pg_row_cost.sh BINARY [SQL]
set -eu
BIN=$1; PRE=${2:-}
S=row_cost_$$
PSQL="psql -q -h 127.0.0.1 -U postgres test"
CONVEYOR_LOG=warn "$BIN" migrate --store "postgres://postgres@127.0.0.1:5432/test?schema=$S" >/dev/null
trap '$PSQL -c "DROP SCHEMA $S CASCADE" >/dev/null 2>&1' EXIT
$PSQL <<SQL | grep '^Time:' | awk '{printf "%s ", $2} END {print "ms"}'
SET search_path=$S;
$PRE
\timing on
INSERT INTO jobs (id, kind, queue, payload, priority, run_at, attempt, max_attempts, tags,
                  state, errors, created_at)
SELECT gen_random_uuid(), 'k', 'q', '{}', 0, now(), 0, 3, '{}', 'available', '[]', now()
FROM generate_series(1, 100000);
\timing off
VACUUM ANALYZE jobs;
CREATE TEMP TABLE ids AS SELECT id, row_number() OVER () AS n FROM jobs;
CREATE INDEX ON ids (n);
ANALYZE ids;
\timing on
DO \$\$ DECLARE b int; BEGIN FOR b IN 0..999 LOOP
  UPDATE jobs SET state = 'running', lease_token = gen_random_uuid(), lease_expires_at = now(),
      started_at = now(), attempt = attempt + 1
  WHERE id = ANY(ARRAY(SELECT id FROM ids WHERE n > b * 100 AND n <= b * 100 + 100));
END LOOP; END \$\$;
DO \$\$ DECLARE b int; BEGIN FOR b IN 0..999 LOOP
  UPDATE jobs SET state = 'completed', finished_at = now(), lease_token = NULL,
      lease_expires_at = NULL
  WHERE id = ANY(ARRAY(SELECT id FROM ids WHERE n > b * 100 AND n <= b * 100 + 100));
END LOOP; END \$\$;
SQL
