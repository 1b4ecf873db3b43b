#!/usr/bin/env python3
"""The Python client's worker for the shared protocol conformance suite
(`crates/conveyor/tests/client_conformance.rs`; the kinds are described in
`clients/CONFORMANCE.md`).

Environment: CONVEYOR_URL, CONVEYOR_TOKEN (optional), CONVEYOR_QUEUES (comma-separated),
CONVEYOR_CONCURRENCY, CONVEYOR_GRACE_SECS, CONVEYOR_LEASE_MS. Prints `ready` on stdout once
running; exits 0 after a graceful stop (SIGTERM/SIGINT), non-zero naming the status when the
server refuses it (401/403).
"""

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

try:
    import conveyor_client  # noqa: F401
except ImportError:  # run from a checkout without `pip install`
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from conveyor_client import ConveyorError, LeasedJob, Permanent, Retry, RetryAfter, Worker


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    url = os.environ.get("CONVEYOR_URL", "http://127.0.0.1:7700")
    queues = [q for q in os.environ.get("CONVEYOR_QUEUES", "default").split(",") if q]
    lease_ms = env_float("CONVEYOR_LEASE_MS", 30_000)
    worker = Worker(
        url,
        queues=queues,
        concurrency=int(env_float("CONVEYOR_CONCURRENCY", 10)),
        token=os.environ.get("CONVEYOR_TOKEN") or None,
        lease=lease_ms / 1000,
        grace_period=env_float("CONVEYOR_GRACE_SECS", 30),
        on_ready=lambda: print("ready", flush=True),
    )

    # A sync handler (runs in the thread pool).
    @worker.handler("ok")
    def ok(job: LeasedJob) -> object:
        return {"echo": job.payload}

    @worker.handler("retry_twice")
    async def retry_twice(job: LeasedJob) -> object:
        if job.attempt < 3:
            raise Retry(f"attempt {job.attempt} fails")
        return {"attempt": job.attempt}

    @worker.handler("retry_after")
    async def retry_after(job: LeasedJob) -> object:
        if job.attempt == 1:
            raise RetryAfter(0.5, "not yet")
        return {"attempt": job.attempt}

    @worker.handler("permanent")
    async def permanent(job: LeasedJob) -> object:
        raise Permanent(message_of(job, "permanent"))

    # A sync handler raising a plain exception: retried with class `Exception`.
    @worker.handler("crash")
    def crash(job: LeasedJob) -> object:
        raise Exception(message_of(job, "crash"))

    @worker.handler("slow")
    async def slow(job: LeasedJob) -> object:
        ms = int((job.payload or {}).get("ms", 1000))
        started = time.monotonic()
        await asyncio.sleep(ms / 1000)
        return {"slept_ms": int((time.monotonic() - started) * 1000)}

    # Returns the wall-clock instant it returned: the suite compares it with the job's
    # finish time at the server, which is when the acknowledgement was applied.
    @worker.handler("stamp")
    async def stamp(job: LeasedJob) -> object:
        return {"returned_at_ms": int(time.time() * 1000)}

    try:
        worker.run()
    except ConveyorError as exc:
        print(f"conformance worker: stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def message_of(job: LeasedJob, default: str) -> str:
    payload = job.payload if isinstance(job.payload, dict) else {}
    return str(payload.get("message") or default)


if __name__ == "__main__":
    sys.exit(main())
