#!/usr/bin/env python3
"""The cost of a per-key limit: drains with and without a named limit on 1,000 keys, run
alternately on each binary given, and the keyed drain as a share of the plain one.

    scripts/keyed.py BINARY [BINARY ...] [--rounds 3] [--store sqlite|postgres|both]
        [--jobs 100000] [--pg-jobs 20000] [--workload drain|enqueue] [--keys 1000]

Each round runs, for each binary in turn, a plain drain and then a keyed drain
(`--limit-keys 1000 --key-concurrency 10`: every job names a customer, and a limit allows 10
running per customer). `--workload enqueue` times the enqueue instead (four producers, batches
of 1,000); `--keys 1` puts every job under one customer (a one-key flood). SQLite uses a fresh temporary database; PostgreSQL (127.0.0.1:5432,
database `test`) a fresh schema, dropped after. The load average is printed at the start and
the end: figures from a busy machine are not comparable.
"""
import argparse
import json
import os
import statistics
import subprocess

PG = "postgres://postgres@127.0.0.1:5432/test"
def run(binary, jobs, store, keys, round_no, workload):
    args = [binary, "bench", "--json", "--workload", workload, "--jobs", str(jobs)]
    schema = None
    if store == "postgres":
        schema = f"bench_keyed_{os.getpid()}_{round_no}"
        args += ["--store", f"{PG}?schema={schema}"]
    if keys:
        args += ["--limit-keys", str(keys), "--key-concurrency", "10"]
    try:
        out = subprocess.run(
            args,
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "CONVEYOR_LOG": "warn"},
        )
    finally:
        if schema:
            subprocess.run(
                ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q", "-c",
                 f"DROP SCHEMA IF EXISTS {schema} CASCADE"],
                check=True,
                capture_output=True,
            )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return next(line["jobs_per_s"] for line in lines if line["workload"] == workload)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--pg-jobs", type=int, default=20_000)
    parser.add_argument("--workload", choices=["drain", "enqueue"], default="drain")
    parser.add_argument("--keys", type=int, default=1000)
    args = parser.parse_args()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    print(f"load at start: {os.getloadavg()}")
    results = {}
    for round_no in range(args.rounds):
        for store in stores:
            jobs = args.jobs if store == "sqlite" else args.pg_jobs
            for binary in args.binaries:
                plain = run(binary, jobs, store, 0, round_no, args.workload)
                keyed = run(binary, jobs, store, args.keys, round_no, args.workload)
                results.setdefault((store, binary), []).append((plain, keyed))
                print(f"round {round_no + 1} {store:8} {binary}: plain {plain:,.0f} "
                      f"keyed {keyed:,.0f} jobs/s ({keyed / plain:.2f})", flush=True)
    print(f"load at end: {os.getloadavg()}")
    print()
    what = args.workload
    print(f"| Store | Binary | Plain {what} (jobs/s) | Keyed {what}, {args.keys} keys (jobs/s) "
          "| Keyed / plain (median) |")
    print("|---|---|---|---|---|")
    for (store, binary), runs in results.items():
        plain = [p for p, _ in runs]
        keyed = [k for _, k in runs]
        ratio = statistics.median(k / p for p, k in runs)
        print(f"| {store} | {binary} | {min(plain):,.0f}-{max(plain):,.0f} "
              f"| {min(keyed):,.0f}-{max(keyed):,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
