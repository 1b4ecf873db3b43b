"""Producers' API: enqueue jobs, read them back, cancel them; create, watch, signal and cancel
workflows; operators' calls for payload schemas, batch kinds, circuit breakers and named limits (sync
and asyncio)."""

from __future__ import annotations

import datetime as _dt
import ssl
from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar, Union

from . import _ops, _wire
from ._async_http import AsyncTransport
from ._sync_http import SyncTransport
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

__all__ = ["Client", "AsyncClient"]

Seconds = Union[int, float, _dt.timedelta]
T = TypeVar("T")

# What each method does (its requests, how it reads the answers, its polling) is written once,
# in _ops; the two classes only run it over their transport, blocking or awaiting.


class Client:
    """A thread-safe client for Conveyor's HTTP API, keeping connections alive between calls.

    ``url`` is the server's base URL (``http://127.0.0.1:7700``); ``token`` an API token
    (``cv_...``) when the server runs with access control. Every failure raises a
    :class:`~conveyor_client.ConveyorError` subclass.
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 60.0,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._http = SyncTransport(url, token, timeout=timeout, ssl_context=ssl_context)

    @property
    def url(self) -> str:
        return self._http.endpoint.url

    def _run(self, op: _ops.Op[T]) -> T:
        return _ops.run_sync(self._http, op)

    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: Optional[int] = None,
        delay: Optional[Seconds] = None,
        run_at: Optional[_dt.datetime] = None,
        max_attempts: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        tenant: Optional[str] = None,
        unique: Optional[Mapping[str, Any]] = None,
        timeout: Optional[Seconds] = None,
        tags: Optional[Iterable[str]] = None,
        ttl: Optional[Seconds] = None,
        expires_at: Optional[_dt.datetime] = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
        limits: Optional[Iterable[str]] = None,
        sequence: Optional[Union[str, Mapping[str, Any]]] = None,
        debounce: Optional[Mapping[str, Any]] = None,
        throttle: Optional[Mapping[str, Any]] = None,
    ) -> str:
        """Enqueues one job; returns its id (the existing job's id when ``idempotency_key`` or
        ``unique`` matched one). ``delay``, ``timeout`` and ``ttl`` are seconds (or timedeltas);
        ``run_at`` and ``expires_at`` aware datetimes. A job not started within ``ttl`` (or by
        ``expires_at``) expires instead of running. ``traceparent``/``tracestate`` (W3C) go
        with the job; by default, the active OpenTelemetry span's. ``limits`` names the named
        limits (:meth:`put_limit`) the job is subject to besides its queue's and its kind's; a
        name no limit is defined for raises ``InvalidRequest`` naming ``limits[i]``.
        ``sequence`` puts the job in a sequence: jobs with the same value at its key run strictly
        one after another, in enqueue order. It is a key expression (``"tenant"``, ``"kind"``,
        ``"queue"`` or ``"payload.account"``) or a dict ``{"key": ..., "on_dead": "block"|"skip"}``
        (whether a dead job holds back the ones behind it: ``"block"``, the default, until it is
        replayed, discarded or cancelled). It overrides the queue's and the kind's sequence; a job
        enqueued behind an unfinished one of its key is stored ``blocked`` until that one
        finishes. An invalid expression raises ``InvalidRequest`` naming ``sequence``.

        ``debounce`` folds a burst of enqueues with the same value at its key (same kind and
        queue) into one job: a dict ``{"key": ..., "delay": seconds, "max_wait": seconds,
        "mode": "trailing"|"leading"}`` (durations as seconds or timedeltas, or ``delay_ms`` /
        ``max_wait_ms``). Trailing (the default): the job runs ``delay`` after the last enqueue
        of the burst, with its payload, but never later than ``max_wait`` after the first (not
        with the job's own ``delay`` or ``run_at``). Leading: the first runs at once and the
        next are dropped while they come less than ``delay`` apart. ``throttle`` (``{"key":
        ..., "period": seconds}`` or ``period_ms``) lets at most one job per key through per
        period and drops the rest. A folded or dropped enqueue returns the id of the job that
        stands (the server answers ``duplicate`` and ``debounced_into``). A job without a value
        at the key is enqueued as usual. Not both, nor with ``unique``: ``InvalidRequest``
        naming ``throttle`` (or ``debounce``); bad values name the field (``debounce.key``,
        ``debounce.delay_ms``)."""
        body = _wire.enqueue_body(
            kind,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            tenant=tenant,
            unique=unique,
            timeout=timeout,
            tags=tags,
            ttl=ttl,
            expires_at=expires_at,
            traceparent=traceparent,
            tracestate=tracestate,
            limits=limits,
            sequence=sequence,
            debounce=debounce,
            throttle=throttle,
        )
        return self._run(_ops.enqueue(body))

    def enqueue_many(self, jobs: Iterable[Union[Mapping[str, Any], Any]]) -> List[str]:
        """Enqueues jobs all or nothing, in one request (at most the server's batch limit,
        10,000 by default); returns their ids in order (for an enqueue a ``debounce`` or
        ``throttle`` folded into another, that job's id, as :meth:`enqueue` does). Each job is
        a dict with ``enqueue``'s keyword names (``kind`` required), a :class:`NewJob`, or an
        object with such attributes."""
        return self._run(_ops.enqueue_many(jobs))

    def send_event(self, name: str, payload: Any = None, *, id: Optional[str] = None) -> Dict[str, Any]:
        """Sends an event: every subscription to ``name`` (``PUT /v1/subscriptions/{name}``)
        makes a job of it, all in one transaction. Sent again with the same ``id``, it makes
        nothing new. Returns ``{"id", "name", "jobs": [{"subscription", "job_id",
        "duplicate"}]}``."""
        return self._run(_ops.send_event(name, payload, id))

    def get(self, id: str) -> Job:
        """The job with its error history; raises ``NotFound`` for an unknown id."""
        return self._run(_ops.get(id))

    def wait(self, id: str, timeout: Seconds = 30.0) -> Job:
        """The job once it has finished (``completed``, ``dead`` or ``cancelled``), or as it is
        when ``timeout`` seconds pass first. The server holds the request until then
        (``GET /v1/jobs/{id}?wait_ms=``), so waiting costs no polling."""
        return self._run(_ops.wait(id, timeout))

    def cancel(self, id: str) -> Job:
        """Cancels an unfinished job (a running one's lease is revoked) and returns it; raises
        ``Conflict`` when it had already finished, ``NotFound`` for an unknown id."""
        return self._run(_ops.cancel(id))

    # --- Workflows ------------------------------------------------------------------------

    def create_flow(
        self,
        steps: Any,
        *,
        name: Optional[str] = None,
        on_failure: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        tags: Optional[Iterable[str]] = None,
    ) -> CreatedFlow:
        """Creates a workflow, all or nothing (``POST /v1/flows``). ``steps`` is a list of steps
        (``step(...)``, ``wait_step(...)`` or dicts in the wire format), ``chain([...])`` /
        ``group([...]).then(...)``, or a whole body (a dict with ``steps``). ``on_failure`` is
        ``"stop"`` (default) or ``"compensate"``; ``idempotency_key`` makes creating it again
        answer the stored flow (``duplicate`` true). Returns the flow's id and each job step's
        job id by name; a refused flow raises ``InvalidRequest`` naming the field
        (``steps[1].after[0]``)."""
        return self._run(
            _ops.create_flow(
                steps, name=name, on_failure=on_failure, idempotency_key=idempotency_key, tags=tags
            )
        )

    def get_flow(self, id: str) -> FlowView:
        """The flow with every step; raises ``NotFound`` for an unknown id (or, for a producer
        token, another token's flow)."""
        return self._run(_ops.get_flow(id))

    def wait_flow(self, id: str, timeout: Seconds = 30.0) -> FlowView:
        """The flow once it has finished (``completed``, ``failed``, ``compensated`` or
        ``cancelled``), or as it is when ``timeout`` seconds pass first; the server holds each
        request (``GET /v1/flows/{id}?wait_ms=``), so waiting costs no polling."""
        return self._run(_ops.wait_flow(id, timeout))

    def list_flows(
        self,
        *,
        state: Optional[str] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        after: Optional[str] = None,
    ) -> FlowPage:
        """Flows newest first, without their steps (admin role with access control); pass the
        page's ``next`` as ``after`` for the next page."""
        return self._run(_ops.list_flows(state=state, name=name, limit=limit, after=after))

    def cancel_flow(self, id: str) -> FlowView:
        """Cancels every unfinished step of the flow and returns it; raises ``Conflict`` when the
        flow has already ended."""
        return self._run(_ops.cancel_flow(id))

    def signal(self, flow_id: str, signal: str, payload: Any = None) -> str:
        """Delivers ``signal`` to the flow's step waiting for it, which completes with
        ``payload`` as its result. Returns ``"delivered"``, or ``"stored"`` when the step has
        not begun waiting yet (it completes as soon as it does). Raises ``InvalidRequest``
        (field ``signal``) when no step waits for it, ``Conflict`` when that step has finished."""
        return self._run(_ops.signal(flow_id, signal, payload))

    # --- Payload schemas ------------------------------------------------------------------

    def set_schema(
        self, kind: str, schema: Any, *, version: Optional[int] = None, force: bool = False
    ) -> Dict[str, Any]:
        """Sets ``kind``'s payload schema (JSON Schema 2020-12; admin role): from then on every
        enqueue of the kind, from any language, is checked against it and a payload that does
        not pass raises ``InvalidRequest`` naming the place (``payload/user_id``). Raises
        ``Conflict`` (``would_fail`` in its body) when queued jobs of the kind would not pass,
        unless ``force``. The kind's circuit breaker stays as it is. Returns ``{kind, schema,
        version, updated_at}`` (and ``circuit_breaker`` when the kind has one)."""
        return self._run(_ops.set_schema(kind, schema, version=version, force=force))

    def get_schema(self, kind: str) -> Dict[str, Any]:
        """``kind``'s settings (``{kind, schema, version, updated_at}``, and ``circuit_breaker``,
        ``limits``, ``sequence`` or ``batch`` when it has them); ``NotFound`` if none."""
        return self._run(_ops.get_schema(kind))

    def list_schemas(self) -> List[Dict[str, Any]]:
        """Every kind with settings, by name."""
        return self._run(_ops.list_schemas())

    def delete_schema(self, kind: str) -> None:
        """Removes ``kind``'s schema (its jobs stay); ``NotFound`` if it had none."""
        self._run(_ops.delete_schema(kind))

    # --- Batches --------------------------------------------------------------------------

    def set_batch(
        self,
        kind: str,
        batch: Optional[Mapping[str, Any]] = None,
        *,
        max_size: Optional[int] = None,
        max_wait: Optional[Seconds] = None,
        max_wait_ms: Optional[int] = None,
        key: Optional[str] = None,
    ) -> Optional[BatchSettings]:
        """Makes ``kind`` a batch kind (``PUT /v1/kinds/{kind}`` with ``batch``; admin role):
        its jobs go out only to batch fetches (a worker's :meth:`Worker.batch_handler`), up to
        ``max_size`` (1 to 1,000) at once, all of one queue and, with ``key`` (``"tenant"``,
        ``"kind"``, ``"queue"`` or ``"payload.a.b"``), of one key value. A batch goes out when
        it is full or its oldest job has waited ``max_wait`` seconds (or a timedelta; or
        ``max_wait_ms``; default 0, at most an hour). The setting is a dict ``batch`` with the
        same names, or the keywords, not both. The rest of the kind's settings (its schema and
        version too) stay as they are. Returns the setting as stored (:class:`BatchSettings`);
        bad values raise ``InvalidRequest`` naming the field (``batch.max_size``,
        ``batch.max_wait_ms``, ``batch.key``)."""
        spec = _wire.batch_spec(batch, max_size=max_size, max_wait=max_wait, max_wait_ms=max_wait_ms, key=key)
        return self._run(_ops.set_batch(kind, spec))

    def remove_batch(self, kind: str) -> None:
        """Makes ``kind`` a plain kind again: its waiting jobs go out to plain fetches (a
        worker's :meth:`Worker.handler`). Nothing to do when it is none."""
        self._run(_ops.remove_batch(kind))

    # --- Circuit breakers -----------------------------------------------------------------

    def set_circuit_breaker(
        self,
        *,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
        settings: Optional[Union[BreakerSettings, Mapping[str, Any]]],
    ) -> Optional[BreakerSettings]:
        """Sets the circuit breaker of ``queue`` or of ``kind`` (in every queue; exactly one of
        them; admin role): ``settings`` is a dict of :class:`BreakerSettings` (every key
        optional: ``failure_ratio``, ``min_calls``, ``window_ms``, ``open_ms``,
        ``half_open_calls``, ``pause_on_retry_after``), or ``None`` to remove the breaker. The
        rest of the queue's or kind's settings stay as they are (a kind's schema and its
        version too). Returns the settings as stored, defaults filled in (``None`` once
        removed). Bad values raise ``InvalidRequest`` naming the field
        (``circuit_breaker.failure_ratio``)."""
        return self._run(_ops.set_circuit_breaker(queue=queue, kind=kind, settings=settings))

    def open_circuit(
        self,
        *,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
        open_ms: Optional[int] = None,
        reason: Optional[str] = None,
    ) -> BreakerView:
        """Opens the circuit breaker of ``queue`` or of ``kind`` by hand (exactly one of them;
        admin role), whether or not one is configured: none of its jobs are handed out. With
        ``open_ms`` it probes after that many milliseconds (or closes, without settings);
        without, it stays open until :meth:`close_circuit`. ``reason`` goes to the audit log
        and the dashboard. Returns the breaker now."""
        return self._run(_ops.open_circuit(queue=queue, kind=kind, open_ms=open_ms, reason=reason))

    def close_circuit(
        self, *, queue: Optional[str] = None, kind: Optional[str] = None, reason: Optional[str] = None
    ) -> BreakerView:
        """Closes the circuit breaker of ``queue`` or of ``kind`` by hand (exactly one of them;
        admin role): its jobs are handed out again at once. Returns the breaker now."""
        return self._run(_ops.close_circuit(queue=queue, kind=kind, reason=reason))

    def list_breakers(self) -> List[BreakerView]:
        """Every circuit breaker, queues' and kinds', that is configured or has a stored state
        (:class:`BreakerView` dicts: ``scope``, ``name``, ``state``, ``reason``, ...)."""
        return self._run(_ops.list_breakers())

    # --- Named limits ---------------------------------------------------------------------

    def put_limit(
        self,
        name: str,
        *,
        concurrency: Optional[int] = None,
        rate: Optional[Mapping[str, Any]] = None,
        key: Optional[str] = None,
        weights: Optional[Mapping[str, int]] = None,
    ) -> Limit:
        """Creates or replaces the named limit ``name`` (``PUT /v1/limits/{name}``; admin
        role): at most ``concurrency`` jobs of one key running at once, at most
        ``rate["count"]`` of them started within any ``rate["period_ms"]``, or both, across
        every worker and server. ``key`` is where a job's key is taken from (``"tenant"``,
        ``"kind"``, ``"queue"`` or a payload path such as ``"payload.customer.id"``); without
        it, every job subject to the limit shares one budget. ``weights`` gives key values more
        starts per round-robin turn (``{"acme": 3}``). Jobs are subject to it when they name it
        (``enqueue(..., limits=[name])``) or their queue's or kind's settings do. Returns the
        limit as stored (:class:`Limit`). Bad values raise ``InvalidRequest`` naming the field
        (``rate.period_ms``, ``key``, ``name``)."""
        return self._run(_ops.put_limit(name, concurrency=concurrency, rate=rate, key=key, weights=weights))

    def get_limit(self, name: str) -> LimitView:
        """The limit with what each of its keys uses now (:class:`LimitView`: its fields,
        ``in_use`` and ``usage``: ``[{key, running, recent_starts}]``); ``NotFound`` if none."""
        return self._run(_ops.get_limit(name))

    def list_limits(self) -> List[Limit]:
        """Every named limit, by name."""
        return self._run(_ops.list_limits())

    def delete_limit(self, name: str) -> None:
        """Removes the limit; ``NotFound`` if there is none, ``Conflict`` (code
        ``limit_in_use``) while a queue's or a kind's settings still name it. Jobs naming it
        themselves do not hold it back; from then on it limits nothing."""
        self._run(_ops.delete_limit(name))

    def stats(
        self,
        from_: Optional[Union[str, _dt.datetime]] = None,
        to: Optional[Union[str, _dt.datetime]] = None,
        step: Optional[Union[str, int, _dt.timedelta]] = None,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
    ) -> Dict[str, Any]:
        """The server's history (admin or viewer role): per-step counts (``series``), ``totals``
        and a summary per queue and kind (``kinds``: ``completed``, ``failed``, ``dead``,
        ``failure_rate``, ``throughput_per_min``, ``run_time``/``queue_wait`` with ``p50_ms``,
        ``p95_ms``, ``p99_ms``). ``from_``/``to`` default to the last hour; ``step`` is whole
        minutes (``60``, ``"5m"``, ``timedelta(hours=1)``)."""
        return self._run(_ops.stats(from_, to, step, queue, kind))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Any other API call: ``client.request("GET", "/v1/queues")``; the answer's JSON."""
        return self._run(_ops.request(method, path, body))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of :class:`Client`: the same methods, as coroutines. Use it from one
    event loop; ``async with AsyncClient(url) as client:`` closes its connections."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 60.0,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._http = AsyncTransport(url, token, timeout=timeout, ssl_context=ssl_context)

    @property
    def url(self) -> str:
        return self._http.endpoint.url

    async def _run(self, op: _ops.Op[T]) -> T:
        return await _ops.run_async(self._http, op)

    async def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: Optional[int] = None,
        delay: Optional[Seconds] = None,
        run_at: Optional[_dt.datetime] = None,
        max_attempts: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        tenant: Optional[str] = None,
        unique: Optional[Mapping[str, Any]] = None,
        timeout: Optional[Seconds] = None,
        tags: Optional[Iterable[str]] = None,
        ttl: Optional[Seconds] = None,
        expires_at: Optional[_dt.datetime] = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
        limits: Optional[Iterable[str]] = None,
        sequence: Optional[Union[str, Mapping[str, Any]]] = None,
        debounce: Optional[Mapping[str, Any]] = None,
        throttle: Optional[Mapping[str, Any]] = None,
    ) -> str:
        body = _wire.enqueue_body(
            kind,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            tenant=tenant,
            unique=unique,
            timeout=timeout,
            tags=tags,
            ttl=ttl,
            expires_at=expires_at,
            traceparent=traceparent,
            tracestate=tracestate,
            limits=limits,
            sequence=sequence,
            debounce=debounce,
            throttle=throttle,
        )
        return await self._run(_ops.enqueue(body))

    async def enqueue_many(self, jobs: Iterable[Union[Mapping[str, Any], Any]]) -> List[str]:
        return await self._run(_ops.enqueue_many(jobs))

    async def send_event(
        self, name: str, payload: Any = None, *, id: Optional[str] = None
    ) -> Dict[str, Any]:
        """See :meth:`Client.send_event`."""
        return await self._run(_ops.send_event(name, payload, id))

    async def get(self, id: str) -> Job:
        return await self._run(_ops.get(id))

    async def wait(self, id: str, timeout: Seconds = 30.0) -> Job:
        """The job once it has finished, or as it is when ``timeout`` seconds pass first (see
        :meth:`Client.wait`)."""
        return await self._run(_ops.wait(id, timeout))

    async def cancel(self, id: str) -> Job:
        return await self._run(_ops.cancel(id))

    # --- Workflows ------------------------------------------------------------------------

    async def create_flow(
        self,
        steps: Any,
        *,
        name: Optional[str] = None,
        on_failure: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        tags: Optional[Iterable[str]] = None,
    ) -> CreatedFlow:
        """See :meth:`Client.create_flow`."""
        return await self._run(
            _ops.create_flow(
                steps, name=name, on_failure=on_failure, idempotency_key=idempotency_key, tags=tags
            )
        )

    async def get_flow(self, id: str) -> FlowView:
        return await self._run(_ops.get_flow(id))

    async def wait_flow(self, id: str, timeout: Seconds = 30.0) -> FlowView:
        """The flow once it has finished, or as it is when ``timeout`` seconds pass first (see
        :meth:`Client.wait_flow`)."""
        return await self._run(_ops.wait_flow(id, timeout))

    async def list_flows(
        self,
        *,
        state: Optional[str] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        after: Optional[str] = None,
    ) -> FlowPage:
        return await self._run(_ops.list_flows(state=state, name=name, limit=limit, after=after))

    async def cancel_flow(self, id: str) -> FlowView:
        return await self._run(_ops.cancel_flow(id))

    async def signal(self, flow_id: str, signal: str, payload: Any = None) -> str:
        """See :meth:`Client.signal`."""
        return await self._run(_ops.signal(flow_id, signal, payload))

    # --- Payload schemas ------------------------------------------------------------------

    async def set_schema(
        self, kind: str, schema: Any, *, version: Optional[int] = None, force: bool = False
    ) -> Dict[str, Any]:
        """See :meth:`Client.set_schema`."""
        return await self._run(_ops.set_schema(kind, schema, version=version, force=force))

    async def get_schema(self, kind: str) -> Dict[str, Any]:
        return await self._run(_ops.get_schema(kind))

    async def list_schemas(self) -> List[Dict[str, Any]]:
        return await self._run(_ops.list_schemas())

    async def delete_schema(self, kind: str) -> None:
        await self._run(_ops.delete_schema(kind))

    # --- Batches --------------------------------------------------------------------------

    async def set_batch(
        self,
        kind: str,
        batch: Optional[Mapping[str, Any]] = None,
        *,
        max_size: Optional[int] = None,
        max_wait: Optional[Seconds] = None,
        max_wait_ms: Optional[int] = None,
        key: Optional[str] = None,
    ) -> Optional[BatchSettings]:
        """See :meth:`Client.set_batch`."""
        spec = _wire.batch_spec(batch, max_size=max_size, max_wait=max_wait, max_wait_ms=max_wait_ms, key=key)
        return await self._run(_ops.set_batch(kind, spec))

    async def remove_batch(self, kind: str) -> None:
        """See :meth:`Client.remove_batch`."""
        await self._run(_ops.remove_batch(kind))

    # --- Circuit breakers -----------------------------------------------------------------

    async def set_circuit_breaker(
        self,
        *,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
        settings: Optional[Union[BreakerSettings, Mapping[str, Any]]],
    ) -> Optional[BreakerSettings]:
        """See :meth:`Client.set_circuit_breaker`."""
        return await self._run(_ops.set_circuit_breaker(queue=queue, kind=kind, settings=settings))

    async def open_circuit(
        self,
        *,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
        open_ms: Optional[int] = None,
        reason: Optional[str] = None,
    ) -> BreakerView:
        """See :meth:`Client.open_circuit`."""
        return await self._run(_ops.open_circuit(queue=queue, kind=kind, open_ms=open_ms, reason=reason))

    async def close_circuit(
        self, *, queue: Optional[str] = None, kind: Optional[str] = None, reason: Optional[str] = None
    ) -> BreakerView:
        """See :meth:`Client.close_circuit`."""
        return await self._run(_ops.close_circuit(queue=queue, kind=kind, reason=reason))

    async def list_breakers(self) -> List[BreakerView]:
        return await self._run(_ops.list_breakers())

    # --- Named limits ---------------------------------------------------------------------

    async def put_limit(
        self,
        name: str,
        *,
        concurrency: Optional[int] = None,
        rate: Optional[Mapping[str, Any]] = None,
        key: Optional[str] = None,
        weights: Optional[Mapping[str, int]] = None,
    ) -> Limit:
        """See :meth:`Client.put_limit`."""
        return await self._run(
            _ops.put_limit(name, concurrency=concurrency, rate=rate, key=key, weights=weights)
        )

    async def get_limit(self, name: str) -> LimitView:
        """See :meth:`Client.get_limit`."""
        return await self._run(_ops.get_limit(name))

    async def list_limits(self) -> List[Limit]:
        return await self._run(_ops.list_limits())

    async def delete_limit(self, name: str) -> None:
        """See :meth:`Client.delete_limit`."""
        await self._run(_ops.delete_limit(name))

    async def stats(
        self,
        from_: Optional[Union[str, _dt.datetime]] = None,
        to: Optional[Union[str, _dt.datetime]] = None,
        step: Optional[Union[str, int, _dt.timedelta]] = None,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
    ) -> Dict[str, Any]:
        """See :meth:`Client.stats`."""
        return await self._run(_ops.stats(from_, to, step, queue, kind))

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        return await self._run(_ops.request(method, path, body))

    async def close(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
