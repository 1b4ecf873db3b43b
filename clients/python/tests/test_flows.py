"""Workflows against a real server: building steps, a chain run by the Worker (results handed
on in ``parents``, progress reported), durable waits completed by ``signal``, ``wait_flow``,
cancel, list, and refused flows."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from conveyor_client import (
    AsyncClient,
    Client,
    Conflict,
    CreatedFlow,
    FlowView,
    InvalidRequest,
    LeasedJob,
    NewJob,
    NotFound,
    Steps,
    Worker,
    chain,
    group,
    step,
    wait_step,
)
from conveyor_client.flows import flow_body
from support import Running, wait_for


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def flow_name() -> str:
    return f"flow-{uuid.uuid4().hex[:10]}"


# --- Building steps (no server) --------------------------------------------------------------


def test_chain_and_group_fill_in_after():
    steps = chain(
        [
            step("fetch", "fetch_page", {"url": "u"}, queue="web", timeout=5),
            group([step("thumbs", "thumbnails"), step("text", "extract_text", on_parent_failure="skip")]),
            wait_step("review", "approved", timeout=60),
            step("publish", "publish_page", compensate="unpublish"),
        ]
    )
    assert isinstance(steps, Steps)
    assert (steps.heads, steps.tails) == (["fetch"], ["publish"])
    by_name = {s["name"]: s for s in steps}
    assert by_name["fetch"] == {
        "name": "fetch",
        "job": {"kind": "fetch_page", "payload": {"url": "u"}, "queue": "web", "timeout_ms": 5000},
    }
    assert by_name["thumbs"]["after"] == ["fetch"]
    assert by_name["text"]["after"] == ["fetch"] and by_name["text"]["on_parent_failure"] == "skip"
    assert by_name["review"] == {
        "name": "review",
        "wait": {"signal": "approved", "timeout_ms": 60000},
        "after": ["thumbs", "text"],
    }
    assert by_name["publish"]["after"] == ["review"]
    assert by_name["publish"]["compensate"] == {"kind": "unpublish"}

    fan_in = group([step("a", "k"), [step("b", "k"), step("c", "k")]]).then(step("d", "k", after=["x"]))
    assert [s["name"] for s in fan_in] == ["a", "b", "c", "d"]
    assert fan_in.steps[3]["after"] == ["x", "a", "b", "c"]
    assert "after" not in fan_in.steps[0]

    # A whole body, hand-written steps with enqueue's keyword names, and NewJob all work.
    body = flow_body(
        {"name": "n", "steps": [{"name": "a", "job": NewJob("k", payload=1, delay=2)}]},
        on_failure="compensate",
        idempotency_key="key",
        tags=["t"],
    )
    assert body == {
        "name": "n",
        "on_failure": "compensate",
        "idempotency_key": "key",
        "tags": ["t"],
        "steps": [{"name": "a", "job": {"kind": "k", "payload": 1, "delay_ms": 2000}}],
    }
    with pytest.raises(ValueError):
        chain([])
    with pytest.raises(TypeError):
        flow_body({"name": "a", "job": {"kind": "k"}})  # a step, not a list of steps
    with pytest.raises(ValueError):
        flow_body([{"job": {"kind": "k"}}])  # no name


# --- Against the server ----------------------------------------------------------------------


def test_a_chain_run_by_the_worker_hands_results_on_and_reports_progress(server, client, queue):
    worker = Worker(server.url, queues=[queue], concurrency=2, poll_wait=1)
    seen = {}

    @worker.handler("extract")
    def extract(job: LeasedJob):
        # A sync handler (on a thread): progress() blocks until the server has it.
        seen["extract"] = job
        job.progress(30, "reading")
        return {"rows": job.payload["rows"]}

    @worker.handler("load")
    async def load(job: LeasedJob):
        seen["load"] = job
        rows = job.parents["extract"]["rows"]
        await job.progress(50, "halfway")
        async with AsyncClient(server.url) as reader:
            during = await reader.get_flow(job.flow_id)
        seen["during"] = during.step("load")
        return {"loaded": rows}

    @worker.handler("plain")
    def plain(job: LeasedJob):
        seen["plain"] = job
        job.progress(100)
        return "ok"

    name = flow_name()
    created = client.create_flow(
        chain([step("extract", "extract", {"rows": 3}, queue=queue), step("load", "load", queue=queue)]),
        name=name,
        tags=["etl"],
    )
    assert isinstance(created, CreatedFlow) and not created.duplicate
    assert set(created.steps) == {"extract", "load"}
    plain_id = client.enqueue("plain", queue=queue)

    with Running(worker):
        flow = client.wait_flow(created.id, timeout=30)
        wait_for("plain job", lambda: client.get(plain_id).state == "completed")

    assert isinstance(flow, FlowView)
    assert (flow.id, flow.name, flow.state, flow.finished) == (created.id, name, "completed", True)
    assert "etl" in flow.tags and flow.finished_at is not None
    assert [s.name for s in flow.steps] == ["extract", "load"]
    extract_view, load_view = flow.step("extract"), flow.step("load")
    assert extract_view.result == {"rows": 3} and extract_view.state == "completed"
    assert load_view.result == {"loaded": 3} and load_view.after == ["extract"]
    assert load_view.job_id == created.steps["load"] and load_view.kind == "load"
    assert flow.step_counts.get("completed") == 2

    job = seen["load"]
    assert (job.id, job.flow_id, job.step) == (created.steps["load"], created.id, "load")
    assert job.parents == {"extract": {"rows": 3}} and job.parent("extract") == {"rows": 3}
    assert seen["extract"].parents == {} and seen["extract"].step == "extract"
    during = seen["during"]
    assert during.state == "active" and during.progress is not None
    assert (during.progress.percent, during.progress.message) == (50, "halfway")
    assert during.progress.at is not None
    assert extract_view.progress is not None and extract_view.progress.percent == 30

    assert (seen["plain"].flow_id, seen["plain"].step, seen["plain"].parents) == (None, None, {})
    with pytest.raises(RuntimeError):
        LeasedJob({"id": "x", "kind": "k", "lease_token": "t"}).progress(1)


def test_a_wait_step_completes_with_a_signal(server, client, queue):
    worker = Worker(server.url, queues=[queue], poll_wait=1)

    @worker.handler("publish")
    async def publish(job: LeasedJob):
        return {"approved_by": job.parents["approval"]["by"]}

    created = client.create_flow(
        [
            wait_step("approval", "approved", timeout=60),
            step("publish", "publish", queue=queue, after=["approval"]),
        ],
        name=flow_name(),
    )
    assert set(created.steps) == {"publish"}  # a wait has no job

    def approval_waits():
        flow = client.get_flow(created.id)
        return flow if flow.step("approval").state == "waiting" else None

    waiting = wait_for("the wait step", approval_waits)
    assert waiting.state == "running" and not waiting.finished
    assert waiting.step("approval").wait == {"signal": "approved", "timeout_ms": 60000}
    assert waiting.step("approval").wait_deadline is not None

    with pytest.raises(InvalidRequest) as caught:
        client.signal(created.id, "rejected")
    assert caught.value.field == "signal"

    with Running(worker):
        assert client.signal(created.id, "approved", {"by": "ana"}) == "delivered"
        flow = client.wait_flow(created.id, timeout=30)
    assert flow.state == "completed"
    assert flow.step("approval").result == {"by": "ana"}
    assert flow.step("publish").result == {"approved_by": "ana"}
    with pytest.raises(Conflict):
        client.signal(created.id, "approved", {"by": "bob"})


def test_a_signal_before_the_wait_begins_is_stored_and_cancel(server, client, queue):
    created = client.create_flow(
        chain([step("first", "nobody_runs_this", queue=queue), wait_step("w", "later")])
    )
    assert client.signal(created.id, "later", 1) == "stored"
    cancelled = client.cancel_flow(created.id)
    assert cancelled.state == "cancelled" and cancelled.finished
    assert {s.state for s in cancelled.steps} == {"cancelled"}
    with pytest.raises(Conflict):
        client.cancel_flow(created.id)
    started = time.monotonic()
    assert client.wait_flow(created.id, timeout=30).state == "cancelled"
    assert time.monotonic() - started < 5


def test_wait_flow_answers_a_running_flow_when_the_timeout_passes(client, queue):
    created = client.create_flow([step("idle", "nobody_runs_this", queue=queue)])
    started = time.monotonic()
    flow = client.wait_flow(created.id, timeout=0.3)
    assert flow.state == "running" and not flow.finished
    assert time.monotonic() - started >= 0.3
    with pytest.raises(ValueError):
        client.wait_flow(created.id, timeout=-1)
    client.cancel_flow(created.id)


def test_refused_flows_name_the_field(client, queue):
    with pytest.raises(InvalidRequest) as caught:
        client.create_flow([step("a", "k", queue=queue), step("b", "k", queue=queue, after=["ghost"])])
    assert caught.value.status == 400 and caught.value.field == "steps[1].after[0]"
    with pytest.raises(InvalidRequest) as caught:
        client.create_flow([step("a", "k"), step("a", "k")])
    assert caught.value.field == "steps[1].name"
    with pytest.raises(NotFound):
        client.get_flow("00000000-0000-0000-0000-000000000000")


def test_idempotency_key_and_list_flows(client, queue):
    name = flow_name()
    key = f"key-{uuid.uuid4().hex}"
    first = client.create_flow([step("a", "nobody_runs_this", queue=queue)], name=name, idempotency_key=key)
    again = client.create_flow([step("a", "nobody_runs_this", queue=queue)], name=name, idempotency_key=key)
    assert again.duplicate and again.id == first.id and again.steps == first.steps
    page = client.list_flows(name=name, state="running", limit=10)
    assert [f.id for f in page.flows] == [first.id] and page.next is None
    assert page.flows[0].steps == [] and page.flows[0].step_counts
    client.cancel_flow(first.id)
    assert client.list_flows(name=name, state="running").flows == []
    assert [f.id for f in client.list_flows(name=name, state="cancelled").flows] == [first.id]
    with pytest.raises(InvalidRequest) as caught:
        client.list_flows(state="sleeping")
    assert caught.value.field == "state"


def test_async_client_flows(server, queue):
    async def main():
        async with AsyncClient(server.url) as client:
            created = await client.create_flow(
                group([wait_step("go", "go"), step("idle", "nobody_runs_this", queue=queue)]),
                name=flow_name(),
            )
            flow = await client.get_flow(created.id)
            assert [s.name for s in flow.steps] == ["go", "idle"]
            assert await client.signal(created.id, "go", {"n": 1}) in ("delivered", "stored")
            assert (await client.wait_flow(created.id, timeout=0.2)).state == "running"
            page = await client.list_flows(name=flow.name)
            assert [f.id for f in page.flows] == [created.id]
            assert (await client.cancel_flow(created.id)).state == "cancelled"
            done = await client.wait_flow(created.id, timeout=10)
            assert done.state == "cancelled" and done.step("go").result == {"n": 1}
            with pytest.raises(InvalidRequest) as caught:
                await client.create_flow([step("a", "k"), step("b", "k", after=["ghost"])])
            assert caught.value.field == "steps[1].after[0]"

    asyncio.run(main())


def test_a_kind_schema_refuses_payloads_naming_the_place(client):
    kind = "signup-" + uuid.uuid4().hex[:8]
    schema = {"type": "object", "required": ["user_id"], "properties": {"user_id": {"type": "integer"}}}
    stored = client.set_schema(kind, schema, version=3)
    assert stored["schema"] == schema and stored["version"] == 3
    assert client.get_schema(kind)["kind"] == kind
    assert kind in [k["kind"] for k in client.list_schemas()]
    with pytest.raises(InvalidRequest) as refused:
        client.enqueue(kind, {"user_id": "seven"})
    assert refused.value.field == "payload/user_id"
    assert client.enqueue(kind, {"user_id": 7})
    # A stricter schema that the queued job would not pass is refused unless forced.
    stricter = {"type": "object", "properties": {"user_id": {"type": "integer", "minimum": 100}}}
    with pytest.raises(Conflict):
        client.set_schema(kind, stricter)
    client.set_schema(kind, stricter, force=True)
    client.delete_schema(kind)
    with pytest.raises(NotFound):
        client.get_schema(kind)


def test_async_client_sets_and_reads_a_schema(server):
    async def main():
        kind = "async-" + uuid.uuid4().hex[:8]
        async with AsyncClient(server.url) as c:
            await c.set_schema(kind, {"type": "object"})
            assert (await c.get_schema(kind))["schema"] == {"type": "object"}
            with pytest.raises(InvalidRequest) as refused:
                await c.enqueue(kind, [1, 2])
            assert refused.value.field == "payload"
            await c.delete_schema(kind)

    asyncio.run(main())
