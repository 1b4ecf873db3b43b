#!/bin/sh
# The common path on PostgreSQL, binaries alternating: for each round and each binary given,
# `conveyor bench --workload enqueue,drain --jobs JOBS` in a fresh schema of the test database
# on 127.0.0.1:5432 (dropped after), one line per run: round, binary, enqueue and drain in
# jobs/s. ROUNDS (default 5) and JOBS (default 20000) set the rounds and the jobs per
# workload, WORKLOADS (default enqueue,drain) what runs; longer runs (JOBS=100000) spread less.
#
#     scripts/plain_ab.sh OLD_BINARY NEW_BINARY [...]
set -eu
PG=postgres://postgres@127.0.0.1:5432/test
export CONVEYOR_LOG="${CONVEYOR_LOG:-warn}"
for r in $(seq "${ROUNDS:-5}"); do
  for b in "$@"; do
    s=bench_plain_ab_$$_$r
    out=$("$b" bench --json --workload "${WORKLOADS:-enqueue,drain}" --jobs "${JOBS:-20000}" --store "$PG?schema=$s")
    psql -q -h 127.0.0.1 -U postgres test -c "DROP SCHEMA $s CASCADE" >/dev/null 2>&1
    echo "$out" | python3 -c '
import json, sys
rates = {}
for line in sys.stdin:
    if line.startswith("{"):
        run = json.loads(line)
        rates[run["workload"]] = round(run["jobs_per_s"])
print(sys.argv[1], sys.argv[2], "enqueue", rates.get("enqueue"), "drain", rates.get("drain"))
' "$r" "$b"
  done
done
