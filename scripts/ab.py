#!/usr/bin/env python3
"""Runs two release binaries of `conveyor` alternately (old, new, old, new, ...) through the same
workloads and prints one Markdown table: the way a restructuring shows it changed no figure.

    scripts/ab.py OLD_BINARY NEW_BINARY [--rounds 3] [--jobs 100000] [--pg-jobs 20000] [--http-jobs 20000]

Each round runs, for each binary in turn:
  - SQLite (a fresh temporary database): enqueue, drain, latency;
  - PostgreSQL (127.0.0.1:5432, database `test`, a fresh schema dropped after): enqueue, drain;
  - over HTTP: `serve` on a fresh SQLite store, then `bench --http` drain and latency.
Both binaries need `conveyor bench` (a build with `--features bench`, or one from before that
feature existed). The load average is printed at the start and the end: figures from a busy
machine are not comparable.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

PG = "postgres://postgres@127.0.0.1:5432/test"


def bench(binary, args, env=None):
    out = subprocess.run(
        [binary, "bench", "--json", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "CONVEYOR_LOG": "warn", **(env or {})},
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def psql(sql):
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q", "-c", sql],
        check=True,
        capture_output=True,
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, server, deadline_s=60):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"serve exited with {server.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("serve did not listen in time")


def one_round(name, binary, round_no, opts):
    rows = {}

    def put(label, lines):
        for line in lines:
            workload = line["workload"]
            value = f'{line["p50_ms"]} / {line["p99_ms"]}' if workload == "latency" else str(
                int(line["jobs_per_s"])
            )
            rows[f"{label} {workload}"] = value

    put("SQLite", bench(binary, ["--workload", "enqueue,drain,latency", "--jobs", str(opts.jobs),
                                 "--concurrency", "100"]))
    schema = f"ab_{name}_{round_no}_{os.getpid()}"
    try:
        put("PostgreSQL", bench(binary, ["--workload", "enqueue,drain", "--jobs", str(opts.pg_jobs),
                                         "--concurrency", "100", "--store", f"{PG}?schema={schema}"]))
    finally:
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    folder = tempfile.mkdtemp(prefix=f"ab-{name}-")
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--store", f"sqlite://{folder}/jobs.db"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CONVEYOR_LOG": "warn"},
    )
    try:
        wait_ready(port, server)
        put("HTTP", bench(binary, ["--http", f"http://127.0.0.1:{port}", "--workload", "drain,latency",
                                   "--jobs", str(opts.http_jobs), "--concurrency", "10"]))
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--pg-jobs", type=int, default=20_000)
    parser.add_argument("--http-jobs", type=int, default=20_000)
    opts = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    results = {"old": [], "new": []}
    for round_no in range(1, opts.rounds + 1):
        for name, binary in (("old", opts.old), ("new", opts.new)):
            rows = one_round(name, binary, round_no, opts)
            print(f"round {round_no} {name}: {rows}", file=sys.stderr)
            results[name].append(rows)
    print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
    labels = list(results["old"][0])
    rounds = " / ".join(str(r) for r in range(1, opts.rounds + 1))
    print(f"| workload (jobs/s; latency p50 / p99 ms) | old: round {rounds} | new: round {rounds} |")
    print("|---|---|---|")
    for label in labels:
        cells = [", ".join(run.get(label, "-") for run in results[name]) for name in ("old", "new")]
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
