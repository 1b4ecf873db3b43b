#!/usr/bin/env bash
# PostgreSQL at depth from a cold start (issue 27, item 9): makes a throwaway PostgreSQL cluster
# (Debian's pg_createcluster, a free port, trust auth) with the settings of this machine's and
# CI's server (autovacuum off, shared_buffers 128MB), runs `conveyor bench --workload
# enqueue,drain --concurrency 100` at each size given, each on a fresh schema, prints the
# drain figures and the table's state after each run, and drops the cluster.
#
#   cargo build --release -p conveyor --features bench
#   scripts/pg_depth.sh 1000000 20000 1000000 20000 1000000 20000
#
# AUTOVACUUM=on runs the same on a cluster with autovacuum on.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release/conveyor
[ -x "$bin" ] || { echo "build first: cargo build --release -p conveyor --features bench" >&2; exit 1; }
[ $# -gt 0 ] || set -- 1000000 20000
version=$(ls /etc/postgresql | sort -V | tail -1)
name="conveyor_depth_$$"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pg_createcluster "$version" "$name" -p "$port" -- --auth=trust >/dev/null
trap 'pg_dropcluster "$version" "$name" --stop >/dev/null 2>&1; rm -rf "/etc/postgresql/$version/$name"' EXIT
conf=/etc/postgresql/$version/$name/conf.d/depth.conf
printf "listen_addresses = '127.0.0.1'\nautovacuum = %s\nshared_buffers = 128MB\n" \
    "${AUTOVACUUM:-off}" >"$conf"
pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start
url="postgres://postgres@127.0.0.1:$port/postgres"
echo "cluster $version/$name on port $port: $(psql "$url" -Atc "SELECT 'autovacuum=' || current_setting('autovacuum') || ' shared_buffers=' || current_setting('shared_buffers') || ' max_wal_size=' || current_setting('max_wal_size')")"
run=0
for n in "$@"; do
    run=$((run + 1))
    schema="depth_${run}_$n"
    out=$(CONVEYOR_LOG=warn "$bin" bench --workload enqueue,drain --concurrency 100 --jobs "$n" \
        --store "$url?schema=$schema")
    drain=$(echo "$out" | awk '/^drain/ {print $2}')
    enqueue=$(echo "$out" | awk '/^enqueue/ {print $2}')
    state=$(psql "$url" -Atc "SELECT n_dead_tup || ' dead, ' || n_live_tup || ' live, ' || \
        vacuum_count || ' vacuums, ' || analyze_count || ' analyzes, table ' || \
        pg_size_pretty(pg_table_size(relid)) || ', indexes ' || pg_size_pretty(pg_indexes_size(relid)) \
        FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname = 'jobs'")
    wal=$(psql "$url" -Atc "SELECT pg_size_pretty(wal_bytes) || ' WAL so far, ' || \
        (SELECT checkpoints_req FROM pg_stat_bgwriter) || ' requested checkpoints' FROM pg_stat_wal")
    printf '%s\t%9d queued\tenqueue %9s/s\tdrain %9s/s\t%s; %s\n' \
        "$(date -u +%H:%M:%S)" "$n" "$enqueue" "$drain" "$state" "$wal"
    psql "$url" -qc "DROP SCHEMA \"$schema\" CASCADE" 2>/dev/null
done
