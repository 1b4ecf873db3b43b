#!/usr/bin/env python3
"""Pages a keyed drain writes, by how the fair index is ordered: a model of the SQLite store in
plain SQLite (Python's sqlite3), to weigh a change of layout before building it.

    scripts/fair_pages.py [key] [tag] [plain]

Each layout enqueues 100,000 jobs spread over 1,000 keys (job n has key n % 1000) in batches
of 1,000, then drains them: each transaction claims 100 jobs and completes the previous
transaction's 100, as the writer's rounds do. It prints the WAL frames (pages) written by
each phase and the seconds taken; the WAL is checkpointed and truncated after every commit so
its size is what that commit wrote.
- key: the fair index ordered by key (`jobs_fair_key` today), a pass reads the next 100 keys
  after the last one served with the skip scan, one job each;
- tag: the fair index ordered by a per-key turn number given at enqueue (the key's k-th job
  has turn k), a pass is one range read in turn order;
- plain: no fair index, a pass is the plain claim order.
"""
import os
import sqlite3
import sys
import tempfile
import time

JOBS, KEYS, BATCH, FETCH = 100_000, 1000, 1000, 100

NEXT_KEYS = """WITH RECURSIVE t(k) AS (
    SELECT (SELECT MIN(fair_key) FROM jobs WHERE state = 'available' AND queue = 'q' AND fair_key > ?1)
    UNION ALL
    SELECT (SELECT MIN(fair_key) FROM jobs WHERE state = 'available' AND queue = 'q' AND fair_key > t.k)
    FROM t WHERE t.k IS NOT NULL)
  SELECT k, (SELECT id FROM jobs WHERE state = 'available' AND queue = 'q' AND fair_key = t.k
             ORDER BY priority DESC, run_at, id LIMIT 1)
  FROM t WHERE k IS NOT NULL LIMIT ?2"""


def pass_by_key(db, cursor):
    rows = db.execute(NEXT_KEYS, (cursor, FETCH)).fetchall()
    if len(rows) < FETCH:
        seen = {key for key, _ in rows}
        rows += [r for r in db.execute(NEXT_KEYS, ("", FETCH - len(rows))) if r[0] not in seen]
    return rows


def run(layout, directory):
    path = os.path.join(directory, f"{layout}.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, queue TEXT, payload TEXT, priority INT, "
        "run_at INT, state TEXT, fair_key TEXT, turn INT, lease TEXT) WITHOUT ROWID"
    )
    db.execute(
        "CREATE INDEX jobs_fetch ON jobs (queue, priority DESC, run_at, id) "
        "WHERE state = 'available'"
    )
    if layout == "key":
        db.execute(
            "CREATE INDEX jobs_fair ON jobs (queue, fair_key, priority DESC, run_at, id) "
            "WHERE state = 'available'"
        )
    elif layout == "tag":
        db.execute(
            "CREATE INDEX jobs_fair ON jobs (queue, priority DESC, turn, fair_key, id) "
            "WHERE state = 'available'"
        )

    def written():
        frames = os.path.getsize(path + "-wal") // (4096 + 24)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return frames

    written()
    started, enqueue = time.time(), 0
    for first in range(0, JOBS, BATCH):
        db.execute("BEGIN")
        for n in range(first, first + BATCH):
            key = n % KEYS
            payload = '{"n": %d, "customer": "c%d"}' % (n, key) + " " * 120
            db.execute(
                "INSERT INTO jobs VALUES (?, 'q', ?, 0, ?, 'available', ?, ?, NULL)",
                (f"{n:012d}", payload, n, f"per-customer:c{key}", n // KEYS),
            )
        db.execute("COMMIT")
        enqueue += written()
    enqueue_s = time.time() - started
    started, drain, cursor, previous = time.time(), 0, "", []
    while True:
        db.execute("BEGIN")
        if layout == "key":
            rows = pass_by_key(db, cursor)
            cursor = rows[-1][0] if rows else ""
        else:
            order = "turn, fair_key, id" if layout == "tag" else "run_at, id"
            rows = db.execute(
                f"SELECT fair_key, id FROM jobs WHERE state = 'available' AND queue = 'q' "
                f"ORDER BY priority DESC, {order} LIMIT ?",
                (FETCH,),
            ).fetchall()
        for _, job in rows:
            db.execute(
                "UPDATE jobs SET state = 'running', lease = 'w' WHERE id = ? AND state = 'available'",
                (job,),
            )
        for job in previous:
            db.execute("UPDATE jobs SET state = 'completed', lease = NULL WHERE id = ?", (job,))
        db.execute("COMMIT")
        drain += written()
        previous = [job for _, job in rows]
        if not rows:
            break
    drain_s = time.time() - started
    db.close()
    print(
        f"{layout:5}  enqueue {enqueue:7,} pages {enqueue_s:5.1f} s   "
        f"drain {drain:7,} pages {drain_s:5.1f} s"
    )


def main():
    layouts = sys.argv[1:] or ["key", "tag", "plain"]
    with tempfile.TemporaryDirectory() as directory:
        for layout in layouts:
            run(layout, directory)


if __name__ == "__main__":
    main()
