#!/usr/bin/env python3
"""Benchmarks the Python client against `conveyor serve`, printing one JSON line per workload
(the fields of `conveyor bench --json`, plus `client`, `transport` and `prefetch`).

    python3 clients/python/bench.py [--url URL [--token T]] [--jobs 20000] [--concurrency 10]
        [--workload enqueue,drain,latency] [--batch 1000] [--prefetch N]
        [--bin PATH] [--durability durable|relaxed]

Without --url it starts `conveyor serve` itself (--bin, else $CONVEYOR_BIN, else the repo's
target/release/conveyor, else target/debug/conveyor) on a fresh SQLite store in a temporary
directory, deleted afterwards.

* enqueue: `AsyncClient.enqueue_many` batches of --batch from 4 concurrent producers.
* drain: --jobs no-op jobs enqueued first, then drained by a `Worker` with an `async def`
  handler at --concurrency; timed until every completion is acknowledged (the worker's stop
  flushed them), and checked on the server.
* latency: enqueue -> handler start on an idle queue, one job at a time (at most 2,000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
try:
    import conveyor_client  # noqa: F401
except ImportError:  # run from a checkout without `pip install`
    sys.path.insert(0, str(HERE / "src"))

from conveyor_client import AsyncClient, LeasedJob, Worker  # noqa: E402

KIND = "bench.noop"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server (default: start one on a temp store)")
    parser.add_argument("--token", help="API token for a server with access control")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--workload", default="enqueue,drain", help="comma-separated: enqueue,drain,latency")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue_many call")
    parser.add_argument(
        "--prefetch", type=int, default=None, help="jobs fetched ahead of free slots (default: the worker's)"
    )
    parser.add_argument("--bin", help="the conveyor binary to start")
    parser.add_argument("--durability", choices=["durable", "relaxed"], default="durable")
    parser.add_argument(
        "--json", action="store_true", help="accepted for symmetry: output is always JSON lines"
    )
    args = parser.parse_args()
    args.workload = [w.strip() for w in args.workload.split(",") if w.strip()]
    for workload in args.workload:
        if workload not in ("enqueue", "drain", "latency"):
            parser.error(f"unknown workload {workload!r}")
    if min(args.jobs, args.concurrency, args.batch) < 1:
        parser.error("--jobs, --concurrency and --batch must be at least 1")
    return args


class Server:
    """`conveyor serve` on a fresh SQLite store, stopped and removed at exit."""

    def __init__(self, binary: Optional[str], durability: str) -> None:
        candidates = [
            binary,
            os.environ.get("CONVEYOR_BIN"),
            str(REPO / "target/release/conveyor"),
            str(REPO / "target/debug/conveyor"),
        ]
        found = next((c for c in candidates if c and Path(c).exists()), None)
        if found is None:
            raise SystemExit("no conveyor binary: pass --url, --bin or set CONVEYOR_BIN")
        self.dir = tempfile.mkdtemp(prefix="conveyor-py-bench-")
        self.proc = subprocess.Popen(
            [
                found,
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--store",
                f"sqlite://{self.dir}/bench.db",
                "--durability",
                durability,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, CONVEYOR_LOG="warn"),
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().decode()
        words = [w for w in first.split() if w.startswith("http://")]
        if not words:
            self.close()
            raise SystemExit(f"conveyor serve did not start: {first!r}")
        self.url = words[0]
        out = self.proc.stdout
        threading.Thread(target=out.read, daemon=True).start()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def jobs_of(queue: str, start: int, end: int) -> List[Dict[str, Any]]:
    return [{"kind": KIND, "payload": {"n": n}, "queue": queue} for n in range(start, end)]


async def enqueue_all(client: AsyncClient, queue: str, jobs: int, batch: int) -> None:
    producers = min(4, -(-jobs // batch))

    async def producer(p: int) -> None:
        for start in range(p * batch, jobs, producers * batch):
            await client.enqueue_many(jobs_of(queue, start, min(start + batch, jobs)))

    await asyncio.gather(*(producer(p) for p in range(producers)))


async def completed_in(client: AsyncClient, queue: str) -> int:
    stats = await client.request("GET", "/v1/queues")
    return sum(q["completed"] for q in stats["queues"] if q["name"] == queue)


def make_worker(args: argparse.Namespace, url: str, queue: str) -> Worker:
    options: Dict[str, Any] = {}
    if args.prefetch is not None:
        options["prefetch"] = args.prefetch
    return Worker(url, queues=[queue], concurrency=args.concurrency, token=args.token, **options)


async def drain(args: argparse.Namespace, url: str, client: AsyncClient, queue: str) -> Tuple[float, Worker]:
    await enqueue_all(client, queue, args.jobs, args.batch)
    worker = make_worker(args, url, queue)
    handled = 0

    @worker.handler(KIND)
    async def noop(job: LeasedJob) -> None:
        nonlocal handled
        handled += 1
        if handled == args.jobs:
            worker.stop()

    started = time.perf_counter()
    await worker.run_async(handle_signals=False)
    seconds = time.perf_counter() - started
    completed = await completed_in(client, queue)
    if completed != args.jobs:
        raise SystemExit(f"drain finished with {completed} of {args.jobs} jobs completed")
    return seconds, worker


async def latency(
    args: argparse.Namespace, url: str, client: AsyncClient, queue: str
) -> Tuple[int, float, float, float, Worker]:
    samples = min(args.jobs, 2000)
    worker = make_worker(args, url, queue)
    started_at: Dict[str, float] = {}
    started_event = asyncio.Event()

    @worker.handler(KIND)
    async def noop(job: LeasedJob) -> None:
        started_at[job.id] = time.perf_counter()
        started_event.set()

    running = asyncio.ensure_future(worker.run_async(handle_signals=False))
    # Let the worker reach its idle long-poll.
    await asyncio.sleep(0.3)
    latencies: List[float] = []
    begin = time.perf_counter()
    for n in range(samples):
        started_event.clear()
        sent = time.perf_counter()
        job_id = await client.enqueue(KIND, {"n": n}, queue=queue)
        await started_event.wait()
        latencies.append(started_at[job_id] - sent)
        # Idle means idle: this job's completion commits before the next enqueue.
        while (await client.get(job_id)).state != "completed":
            await asyncio.sleep(0.0005)
    seconds = time.perf_counter() - begin
    worker.stop()
    await running
    latencies.sort()

    def pick(q: float) -> float:
        return latencies[round((len(latencies) - 1) * q)]

    return samples, seconds, pick(0.5), pick(0.99), worker


async def main() -> None:
    args = parse_args()
    server = None if args.url else Server(args.bin, args.durability)
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        async with AsyncClient(url, args.token) as client:
            for workload in args.workload:
                queue = f"bench-{workload}-{uuid.uuid4().hex[:10]}"
                line: Dict[str, Any] = {
                    "workload": workload,
                    "client": "python",
                    "transport": "http: asyncio streams keep-alive, batched acks on fetch",
                    "store": "sqlite://(temp file)" if server else url,
                    "durable": (args.durability == "durable") if server else None,
                    "durability": (
                        (
                            "sqlite: fsync before every acknowledgement"
                            if args.durability == "durable"
                            else "sqlite relaxed: no fsync per commit"
                        )
                        if server
                        else f"the server at {url}"
                    ),
                    "jobs": args.jobs,
                    "concurrency": args.concurrency,
                    "tenants": 0,
                    "concurrency_limit": None,
                    "per_key_concurrency_limit": None,
                    "rate_limit": None,
                }
                if workload == "enqueue":
                    started = time.perf_counter()
                    await enqueue_all(client, queue, args.jobs, args.batch)
                    seconds = time.perf_counter() - started
                    line.update(
                        batch=args.batch, seconds=round(seconds, 3), jobs_per_s=round(args.jobs / seconds)
                    )
                elif workload == "drain":
                    seconds, worker = await drain(args, url, client, queue)
                    line.update(
                        prefetch=worker.prefetch,
                        seconds=round(seconds, 3),
                        jobs_per_s=round(args.jobs / seconds),
                    )
                else:
                    samples, seconds, p50, p99, worker = await latency(args, url, client, queue)
                    line.update(
                        jobs=samples,
                        prefetch=worker.prefetch,
                        seconds=round(seconds, 3),
                        jobs_per_s=round(samples / seconds),
                        p50_ms=round(p50 * 1000, 3),
                        p99_ms=round(p99 * 1000, 3),
                    )
                print(json.dumps(line), flush=True)
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    asyncio.run(main())
