"""Every call of ``Client`` and ``AsyncClient``, written once.

An operation is a generator: it yields each HTTP request it needs (a :class:`Call`), is sent
the answer's JSON (or has the request's ``ConveyorError`` thrown in at the ``yield``), and
returns the method's result. :func:`run_sync` and :func:`run_async` drive one over a transport,
so the two clients only differ in how they wait for the network.
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    TypeVar,
    Union,
    cast,
)

from . import _wire
from ._async_http import AsyncTransport
from ._sync_http import SyncTransport
from .errors import ConveyorError, NotFound
from .flows import flow_body
from .models import (
    BatchSettings,
    BreakerSettings,
    BreakerView,
    CreatedFlow,
    FlowPage,
    FlowView,
    Job,
    Limit,
    LimitView,
)

T = TypeVar("T")


class Call(NamedTuple):
    """One request: ``body`` is JSON-encoded (none for ``None``); ``timeout`` in seconds
    replaces the transport's for this request."""

    method: str
    path: str
    body: Any = None
    timeout: Optional[float] = None


# An operation: yields Calls, is sent their answers, returns T.
Op = Generator[Call, Any, T]


def run_sync(http: SyncTransport, op: Op[T]) -> T:
    """Runs ``op`` to its end, sending its requests through ``http``."""
    answer: Any = None
    error: Optional[ConveyorError] = None
    try:
        while True:
            call = op.send(answer) if error is None else op.throw(error)
            answer, error = None, None
            try:
                answer = http.request(call.method, call.path, call.body, timeout=call.timeout)
            except ConveyorError as exc:
                error = exc
    except StopIteration as stop:
        return cast(T, stop.value)
    finally:
        op.close()


async def run_async(http: AsyncTransport, op: Op[T]) -> T:
    """:func:`run_sync` on the asyncio transport."""
    answer: Any = None
    error: Optional[ConveyorError] = None
    try:
        while True:
            call = op.send(answer) if error is None else op.throw(error)
            answer, error = None, None
            try:
                answer = await http.request(call.method, call.path, call.body, timeout=call.timeout)
            except ConveyorError as exc:
                error = exc
    except StopIteration as stop:
        return cast(T, stop.value)
    finally:
        op.close()


# --- Jobs -----------------------------------------------------------------------------------


def enqueue(body: Dict[str, Any]) -> Op[str]:
    """Enqueues one job. The callers build ``body`` with ``_wire.enqueue_body`` from their own
    arguments, so the type checker sees every keyword passed on."""
    return _wire.enqueued_id((yield Call("POST", "/v1/jobs", body)))


def enqueue_many(jobs: Iterable[Union[Mapping[str, Any], Any]]) -> Op[List[str]]:
    bodies = [_wire.job_spec_body(job, i) for i, job in enumerate(jobs)]
    if not bodies:
        return []
    return _wire.batch_ids((yield Call("POST", "/v1/jobs/batch", {"jobs": bodies})))


def send_event(name: str, payload: Any, id: Optional[str]) -> Op[Dict[str, Any]]:
    """Sends an event; the answer names the event's id and each job a subscription made."""
    body: Dict[str, Any] = {"name": name, "payload": {} if payload is None else payload}
    if id is not None:
        body["id"] = id
    answer = yield Call("POST", "/v1/events", body)
    return dict(answer)


def get(id: str) -> Op[Job]:
    return Job.from_json((yield Call("GET", _wire.job_path(id))))


def _long_poll(
    path: str, timeout: _wire.Seconds, parse: Callable[[Any], T], done: Callable[[T], bool]
) -> Op[T]:
    """``GET path?wait_ms=`` again and again, each held by the server for at most
    ``MAX_WAIT_MS``, until the parsed answer is ``done`` or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + _wire.wait_deadline_ms(timeout) / 1000
    while True:
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        wait_ms = min(left_ms, _wire.MAX_WAIT_MS)
        value = parse((yield Call("GET", f"{path}?wait_ms={wait_ms}", timeout=wait_ms / 1000 + 30)))
        if done(value) or time.monotonic() >= deadline:
            return value


def wait(id: str, timeout: _wire.Seconds) -> Op[Job]:
    def finished(job: Job) -> bool:
        return job.state in _wire.FINISHED_STATES

    return (yield from _long_poll(_wire.job_path(id), timeout, Job.from_json, finished))


def cancel(id: str) -> Op[Job]:
    return Job.from_json((yield Call("POST", _wire.job_path(id, "cancel"))))


# --- Workflows ------------------------------------------------------------------------------


def create_flow(
    steps: Any,
    *,
    name: Optional[str],
    on_failure: Optional[str],
    idempotency_key: Optional[str],
    tags: Optional[Iterable[str]],
) -> Op[CreatedFlow]:
    body = flow_body(steps, name=name, on_failure=on_failure, idempotency_key=idempotency_key, tags=tags)
    return CreatedFlow.from_json((yield Call("POST", "/v1/flows", body)))


def get_flow(id: str) -> Op[FlowView]:
    return FlowView.from_json((yield Call("GET", _wire.flow_path(id))))


def wait_flow(id: str, timeout: _wire.Seconds) -> Op[FlowView]:
    def finished(flow: FlowView) -> bool:
        return flow.finished

    return (yield from _long_poll(_wire.flow_path(id), timeout, FlowView.from_json, finished))


def list_flows(
    *, state: Optional[str], name: Optional[str], limit: Optional[int], after: Optional[str]
) -> Op[FlowPage]:
    path = "/v1/flows" + _wire.query({"state": state, "name": name, "limit": limit, "after": after})
    return FlowPage.from_json((yield Call("GET", path)))


def cancel_flow(id: str) -> Op[FlowView]:
    return FlowView.from_json((yield Call("POST", _wire.flow_path(id, "cancel"))))


def signal(flow_id: str, signal: str, payload: Any) -> Op[str]:
    body = _wire.signal_body(signal, payload)
    return _wire.signal_outcome((yield Call("POST", _wire.flow_path(flow_id, "signal"), body)))


# --- Payload schemas ------------------------------------------------------------------------


def set_schema(kind: str, schema: Any, *, version: Optional[int], force: bool) -> Op[Dict[str, Any]]:
    answer = yield Call("PUT", _wire.kind_path(kind), _wire.kind_body(schema, version, force))
    return cast(Dict[str, Any], answer)


def get_schema(kind: str) -> Op[Dict[str, Any]]:
    return cast(Dict[str, Any], (yield Call("GET", _wire.kind_path(kind))))


def list_schemas() -> Op[List[Dict[str, Any]]]:
    return cast(List[Dict[str, Any]], (yield Call("GET", "/v1/kinds"))["kinds"])


def delete_schema(kind: str) -> Op[None]:
    yield Call("DELETE", _wire.kind_path(kind))


# --- Batches --------------------------------------------------------------------------------


def set_batch(kind: str, spec: Dict[str, Any]) -> Op[Optional[BatchSettings]]:
    # The rest of the kind's settings (its schema and version too) stay as they are.
    return _wire.stored_batch((yield Call("PUT", _wire.kind_path(kind), {"batch": spec})))


def remove_batch(kind: str) -> Op[None]:
    try:
        existing = yield Call("GET", _wire.kind_path(kind))
    except NotFound:
        return None  # no settings, so no batch setting to remove
    if _wire.stored_batch(existing) is not None:
        yield Call("PUT", _wire.kind_path(kind), {"batch": None})
    return None


# --- Circuit breakers -----------------------------------------------------------------------


def set_circuit_breaker(
    *,
    queue: Optional[str],
    kind: Optional[str],
    settings: Optional[Union[BreakerSettings, Mapping[str, Any]]],
) -> Op[Optional[BreakerSettings]]:
    scope, name = _wire.breaker_scope(queue, kind)
    body: Dict[str, Any] = {"circuit_breaker": _wire.breaker_settings(settings)}
    if scope == "kind":
        # Keep the kind's schema version: the PUT replaces the kind's settings.
        try:
            existing = yield Call("GET", _wire.scope_path(scope, name))
        except NotFound:
            if settings is None:
                return None  # no settings, so no breaker to remove
            existing = None
        body.update(_wire.kept_version(existing))
    return _wire.stored_breaker((yield Call("PUT", _wire.scope_path(scope, name), body)))


def open_circuit(
    *, queue: Optional[str], kind: Optional[str], open_ms: Optional[int], reason: Optional[str]
) -> Op[BreakerView]:
    scope, name = _wire.breaker_scope(queue, kind)
    body = _wire.circuit_body(open_ms, reason)
    return cast(BreakerView, (yield Call("POST", _wire.scope_path(scope, name, "open"), body)))


def close_circuit(*, queue: Optional[str], kind: Optional[str], reason: Optional[str]) -> Op[BreakerView]:
    scope, name = _wire.breaker_scope(queue, kind)
    body = _wire.circuit_body(None, reason)
    return cast(BreakerView, (yield Call("POST", _wire.scope_path(scope, name, "close"), body)))


def list_breakers() -> Op[List[BreakerView]]:
    return cast(List[BreakerView], (yield Call("GET", "/v1/breakers"))["breakers"])


# --- Named limits --------------------------------------------------------------------------


def put_limit(
    name: str,
    *,
    concurrency: Optional[int],
    rate: Optional[Mapping[str, Any]],
    key: Optional[str],
    weights: Optional[Mapping[str, int]],
) -> Op[Limit]:
    body = _wire.limit_body(concurrency, rate, key, weights)
    return cast(Limit, (yield Call("PUT", _wire.limit_path(name), body)))


def get_limit(name: str) -> Op[LimitView]:
    return cast(LimitView, (yield Call("GET", _wire.limit_path(name))))


def list_limits() -> Op[List[Limit]]:
    return cast(List[Limit], (yield Call("GET", "/v1/limits"))["limits"])


def delete_limit(name: str) -> Op[None]:
    yield Call("DELETE", _wire.limit_path(name))


# --- Anything else --------------------------------------------------------------------------


def stats(
    from_: Optional[Union[str, _dt.datetime]],
    to: Optional[Union[str, _dt.datetime]],
    step: Optional[Union[str, int, _dt.timedelta]],
    queue: Optional[str],
    kind: Optional[str],
) -> Op[Dict[str, Any]]:
    return cast(Dict[str, Any], (yield Call("GET", _wire.stats_path(from_, to, step, queue, kind))))


def request(method: str, path: str, body: Any) -> Op[Any]:
    return (yield Call(method, path, body))
