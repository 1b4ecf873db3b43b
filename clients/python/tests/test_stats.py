"""History (``stats()``, sync and async) against a real server: jobs enqueued, taken and
finished through it show up per kind, filters narrow it, bad input is a clear error."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest

from conveyor_client import AsyncClient, Client, InvalidRequest


def work(client: Client, queue: str, fail: bool) -> None:
    jobs = client.request("POST", "/v1/fetch", {"worker_id": "py-stats", "queues": [queue], "max": 10})["jobs"]
    assert jobs, "a job to take"
    for job in jobs:
        if fail:
            body = {"lease_token": job["lease_token"], "error": {"message": "no"}, "retry": "never"}
            client.request("POST", f"/v1/jobs/{job['id']}/fail", body)
        else:
            client.request("POST", f"/v1/jobs/{job['id']}/complete", {"lease_token": job["lease_token"]})


def test_finished_jobs_show_in_the_history_per_kind(server):
    queue = f"py-stats-{uuid.uuid4().hex[:8]}"
    with Client(server.url) as client:
        for _ in range(3):
            client.enqueue("py.ok", {}, queue=queue)
        work(client, queue, fail=False)
        client.enqueue("py.bad", {}, queue=queue)
        work(client, queue, fail=True)

        since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)
        report = client.stats(from_=since, step=dt.timedelta(minutes=1), queue=queue)
        assert report["step_s"] == 60
        assert report["totals"]["completed"] == 3
        assert report["totals"]["dead"] == 1
        kinds = {k["kind"]: k for k in report["kinds"]}
        assert set(kinds) == {"py.ok", "py.bad"}
        assert kinds["py.bad"]["failure_rate"] == 1.0
        assert kinds["py.ok"]["run_time"]["count"] == 3, "one run time per completed attempt"
        assert kinds["py.ok"]["queue_wait"]["count"] == 3, "one wait per attempt handed out"
        only = client.stats(queue=queue, kind="py.ok", step="5m")
        assert only["totals"]["completed"] == 3 and only["totals"]["failed"] == 0

        with pytest.raises(InvalidRequest) as bad:
            client.stats(step=90)
        assert bad.value.field == "step"

    async def read() -> dict:
        async with AsyncClient(server.url) as client:
            return await client.stats(queue=queue)

    assert asyncio.run(read())["totals"]["completed"] == 3
