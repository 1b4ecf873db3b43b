#!/usr/bin/env python3
"""What the `jobs` table's partial indexes cost an insert on SQLite, even for rows that enter
none of them: the table and its indexes as `conveyor serve` creates them (a fresh database in
a temp dir), copied into an in-memory database, then 50,000 plain rows inserted with every
index and again without the named ones, five rounds alternating which goes first, and the
medians.

    scripts/index_probe.py BINARY [INDEX ...]

With no index named, the six added for issue 31 are left out. Python's sqlite3 is not
Conveyor's bundled SQLite, so only the ratio within one run means something.
"""
import socket
import statistics
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

ISSUE_31 = ["jobs_limited", "jobs_running_limited", "jobs_fair_key", "jobs_sequence",
            "jobs_sequence_open", "jobs_fold"]
ROWS = 50_000


def schema(binary):
    """The jobs table and its indexes of a database `binary` has just created."""
    with tempfile.TemporaryDirectory() as work:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        path = f"{work}/db.sqlite"
        server = subprocess.Popen(
            [binary, "serve", "--store", f"sqlite://{path}", "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise SystemExit("the server did not start")
                    time.sleep(0.05)
        finally:
            server.terminate()
            server.wait()
        db = sqlite3.connect(path)
        table = db.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
        indexes = db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                             "AND tbl_name = 'jobs' AND sql IS NOT NULL").fetchall()
        return table, indexes


def rate(table, indexes, skip, rows):
    db = sqlite3.connect(":memory:")
    db.execute(table)
    for name, sql in indexes:
        if name not in skip:
            db.execute(sql)
    started = time.perf_counter()
    db.executemany(
        "INSERT INTO jobs (id, kind, queue, payload, priority, run_at, attempt, max_attempts, "
        "tags, state, errors, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    return round(len(rows) / (time.perf_counter() - started))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    table, indexes = schema(sys.argv[1])
    skip = sys.argv[2:] or ISSUE_31
    rows = [(str(uuid.uuid4()), "probe", "default", '{"n": 1}', 0, n, 0, 25, "[]", "available",
             "[]", n) for n in range(ROWS)]
    print(f"indexes on jobs: {len(indexes)}; left out: {', '.join(skip)}")
    # Which variant runs first alternates: the second run of a pair is helped by the memory
    # the first left allocated (an earlier version always ran `all` first and showed the
    # indexes costing 15 % that alternating does not show).
    results = {"all": [], "without": []}
    for round_no in range(1, 6):
        order = [("all", []), ("without", skip)]
        if round_no % 2 == 0:
            order.reverse()
        for name, left_out in order:
            results[name].append(rate(table, indexes, left_out, rows))
        print(f"round {round_no}: all {results['all'][-1]} rows/s, "
              f"without {results['without'][-1]} rows/s")
    print(f"median: all {statistics.median(results['all'])} rows/s, "
          f"without {statistics.median(results['without'])} rows/s")


if __name__ == "__main__":
    main()
