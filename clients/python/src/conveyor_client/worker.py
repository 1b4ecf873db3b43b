"""The worker: fetches jobs under a lease, runs their handlers, reports their outcomes.

One asyncio loop does all the talking to the server:

* the fetch loop long-polls ``POST /v1/fetch`` for as many jobs as there are free slots
  (``kinds`` = the kinds with a handler), carrying the acknowledgements gathered since the
  last call;
* the ack loop flushes acknowledgements with ``POST /v1/ack`` when no fetch takes them soon
  (e.g. while the fetch is long-polling an idle queue);
* the batch fetch loop (with batch handlers only) long-polls ``POST /v1/fetch`` with
  ``"batch": true`` and ``kinds`` = the kinds with a batch handler, for one batch at a time
  while fewer than ``batch_concurrency`` batches run;
* the heartbeat loop renews every held lease with ``POST /v1/heartbeat`` every ``lease / 3``.

Async handlers run on the loop; sync handlers run in a pool of daemon threads (so a handler
stuck past the grace period never keeps the process from exiting); sync batch handlers in a
pool of their own.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import functools
import inspect
import logging
import math
import os
import queue as _queue
import random
import re
import secrets
import signal
import socket
import ssl
import threading
import time
import traceback
from typing import (
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Generator,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from . import _trace, _wire
from ._async_http import AsyncTransport
from ._version import __version__
from .errors import (
    ConveyorError,
    Forbidden,
    InvalidRequest,
    LeaseLost,
    PayloadTooLarge,
    Permanent,
    Retry,
    RetryAfter,
    ServerError,
    TransportError,
    Unauthorized,
)
from .models import LeasedJob, format_time

__all__ = ["Worker", "Handler", "BatchHandler", "error_class_name"]

log = logging.getLogger("conveyor_client.worker")

Handler = Callable[[LeasedJob], Any]
# Takes the jobs of one batch; returns None or one outcome per job, in order (see batch_handler).
BatchHandler = Callable[[List[LeasedJob]], Any]
Outcome = Tuple[str, Dict[str, Any]]
F = TypeVar("F", bound=Callable[..., Any])
Seconds = Union[int, float, _dt.timedelta]

# How often the worker registry (`/v1/workers`) hears from a worker that is too busy to fetch.
REGISTRY_INTERVAL = 10.0
# Longest error message sent (a traceback is welcome, a megabyte of one is not).
MAX_MESSAGE_CHARS = 32 * 1024
# The server keeps the first 32 KiB of a traceback; send no more.
_MAX_BACKTRACE = 32 * 1024
MAX_FETCH = 1000
MAX_AUTO_PREFETCH = 1000
MAX_HEARTBEAT_BATCH = 1000
MAX_ACK_BATCH = 5000
_CLASS_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_ACK_FIELD = re.compile(r"^(complete|fail)\[(\d+)\]")


def _seconds(value: Seconds, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, _dt.timedelta) else float(value)
    if not seconds >= 0:
        raise ValueError(f"{name} must be a non-negative number of seconds")
    return seconds


def error_class_name(exc: BaseException) -> str:
    """An exception's class name as the server takes it: 1-128 of ``[A-Za-z0-9_.:-]``."""
    name = _CLASS_CHARS.sub("_", type(exc).__name__)[:128]
    return name or "error"


def _check_handler(kind: str, fn: Any) -> None:
    if not isinstance(kind, str) or not kind:
        raise ValueError("kind must be a non-empty string")
    if not callable(fn):
        raise TypeError("a handler must be callable")


def _is_async(fn: Any) -> bool:
    # An object with an `async def __call__` counts too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _ewma(average: Optional[float], sample: float, weight: float = 0.2) -> float:
    return sample if average is None else average + weight * (sample - average)


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2 - 20
    return text[:half] + "\n... [truncated] ...\n" + text[-half:]


class _Backoff:
    """Capped exponential backoff with ±20 % jitter."""

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        delay: float = min(self.cap, self.base * 2.0 ** min(self.failures, 30))
        self.failures += 1
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.failures = 0


class _DaemonPool:
    """A thread pool of daemon threads (``concurrent.futures`` joins its threads at exit,
    so a sync handler still running after the grace period would hold the process)."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._queue: "_queue.SimpleQueue[Optional[Callable[[], None]]]" = _queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle <= 0 and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._queue.put(fn)

    def _work(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001 - never let a handler kill the pool thread
                log.exception("sync handler wrapper failed")
            with self._lock:
                self._idle += 1

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []


# Phases of a held job.
_BUFFERED, _RUNNING, _DONE = 0, 1, 2


class _Slot:
    """One job the worker holds a lease on, from fetch until its acknowledgement is answered
    (or it is released or found lost)."""

    __slots__ = (
        "job",
        "handler",
        "phase",
        "reported",
        "ack",
        "ack_kind",
        "replaced",
        "retransmitted",
        "lost",
        "abandoned",
        "timed_out",
        "task",
        "timer",
        "occupying",
        "started",
        "batch",
    )

    def __init__(self, job: LeasedJob) -> None:
        self.job = job
        self.handler: Optional[Handler] = None
        self.phase = _BUFFERED
        self.reported = False
        self.ack = ""
        self.ack_kind = ""
        self.replaced = False
        self.retransmitted = False
        self.lost = False
        self.abandoned = False
        self.timed_out = False
        self.task: Optional["asyncio.Task[None]"] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.occupying = False
        self.started = 0.0
        self.batch: Optional[_Batch] = None

    @property
    def key(self) -> str:
        return self.job.lease_token

    def lease_json(self) -> Dict[str, str]:
        return {"id": self.job.id, "lease_token": self.job.lease_token}


class _Batch:
    """The jobs of one batch, run by one call of their kind's batch handler. Each job keeps its
    own slot (lease, heartbeats, acknowledgement); the batch takes one ``batch_concurrency``
    place from its start until every job has an outcome (or the handler is given up)."""

    __slots__ = ("kind", "slots", "task", "timer", "timed_out", "timeout_ms", "abandoned", "finished")

    def __init__(self, kind: str, slots: List[_Slot]) -> None:
        self.kind = kind
        self.slots = slots
        self.task: Optional["asyncio.Task[None]"] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timed_out = False
        self.timeout_ms = 0
        self.abandoned = False
        self.finished = False

    @property
    def jobs(self) -> List[LeasedJob]:
        return [slot.job for slot in self.slots]

    @property
    def all_lost(self) -> bool:
        return all(slot.lost for slot in self.slots)


class Worker:
    """Runs handlers for jobs fetched from ``queues`` of the server at ``url``.

    Options: ``concurrency`` (handlers running at once), ``token`` (a worker-role API token),
    ``lease`` (seconds each lease lasts; renewed every ``lease / 3``), ``grace_period``
    (seconds running handlers get to finish on SIGTERM/SIGINT or ``stop()`` before their jobs
    are released), ``poll_wait`` (seconds a fetch long-polls an idle queue, at most 30),
    ``prefetch`` (jobs fetched ahead of free slots, waiting under a renewed lease: more
    throughput for short jobs; ``"auto"``, the default, holds enough for every slot to run
    through two fetch round trips, from the measured handler and round-trip times, so long
    jobs get none and no-op jobs up to 1,000), ``worker_id`` (shown in ``/v1/workers``), ``max_backoff``
    (longest pause between retries while the server is unreachable), ``ack_delay`` (how long a
    finished job's acknowledgement waits for a fetch to carry it before it is sent alone),
    ``on_ready`` (called once the worker runs, before its first fetch), ``batch_concurrency``
    (batches running at once, default 1; see :meth:`batch_handler`).
    """

    def __init__(
        self,
        url: str,
        queues: Union[str, Sequence[str]] = ("default",),
        concurrency: int = 10,
        token: Optional[str] = None,
        *,
        lease: Seconds = 30.0,
        grace_period: Seconds = 30.0,
        poll_wait: Seconds = 20.0,
        prefetch: Union[int, str] = "auto",
        worker_id: Optional[str] = None,
        max_backoff: Seconds = 5.0,
        ack_delay: Seconds = 0.01,
        ssl_context: Optional[ssl.SSLContext] = None,
        on_ready: Optional[Callable[[], Any]] = None,
        batch_concurrency: int = 1,
    ) -> None:
        if isinstance(queues, str):
            queues = [queues]
        self.queues: List[str] = list(queues)
        if not self.queues:
            raise ValueError("give at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if isinstance(batch_concurrency, bool) or not isinstance(batch_concurrency, int):
            raise ValueError("batch_concurrency must be an integer of at least 1")
        if batch_concurrency < 1:
            raise ValueError("batch_concurrency must be an integer of at least 1")
        if prefetch != "auto" and (not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError('prefetch must be "auto" or an integer of at least 0')
        self.url = url
        self.token = token or None
        self.concurrency = int(concurrency)
        self.batch_concurrency = batch_concurrency
        self.prefetch: Union[int, str] = prefetch
        self.lease = _seconds(lease, "lease")
        self.lease_ms = int(round(self.lease * 1000))
        if not 100 <= self.lease_ms <= 86_400_000:
            raise ValueError("lease must be from 0.1 s to one day")
        self.grace_period = _seconds(grace_period, "grace_period")
        self.poll_wait_ms = min(30_000, int(round(_seconds(poll_wait, "poll_wait") * 1000)))
        self.max_backoff = max(0.05, _seconds(max_backoff, "max_backoff"))
        self.ack_delay = _seconds(ack_delay, "ack_delay")
        self.ssl_context = ssl_context
        self.on_ready = on_ready
        host = socket.gethostname()
        self.host = host
        self.worker_id = (worker_id or f"{host}-{os.getpid()}-{secrets.token_hex(3)}")[:256]
        self._handlers: Dict[str, Handler] = {}
        self._is_async: Dict[str, bool] = {}
        self._batch_handlers: Dict[str, BatchHandler] = {}
        self._batch_is_async: Dict[str, bool] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[int] = None
        self._stop_requested = False
        self._running = False

    # --- Handlers ---------------------------------------------------------------------------

    def handler(self, kind: str) -> Callable[[F], F]:
        """Decorator: ``@worker.handler("send_email")`` over a function (sync or ``async def``)
        taking the job. Its return value (JSON) is the job's result; raising ``Retry``,
        ``RetryAfter`` or ``Permanent`` steers the retry; any other exception retries with its
        class name and traceback recorded."""

        def register(fn: F) -> F:
            self.add_handler(kind, fn)
            return fn

        return register

    def add_handler(self, kind: str, fn: Handler) -> None:
        _check_handler(kind, fn)
        if kind in self._batch_handlers:
            raise ValueError(f"kind {kind!r} already has a batch handler")
        self._handlers[kind] = fn
        self._is_async[kind] = _is_async(fn)

    def batch_handler(self, kind: str) -> Callable[[F], F]:
        """Decorator: ``@worker.batch_handler("rows.insert")`` over a function (sync or ``async
        def``) taking a list of jobs (the :class:`LeasedJob` objects a handler gets), all of
        one kind and one queue (and one key value), for a kind whose jobs go out in batches
        (``client.set_batch(kind, max_size=..., max_wait=..., key=...)``). It returns one
        outcome per job, in the jobs' order: an exception instance fails that job (``Retry``,
        ``RetryAfter`` and ``Permanent`` steer its retry as when a handler raises them; any
        other retries with its class name), anything else is that job's result. ``None``
        completes them all without a result. If the handler raises, every job of the batch
        fails with that error; jobs it returns no outcome for fail (class
        ``missing_outcome``); outcomes past the last job are ignored (and logged). Each job
        keeps its own attempts, retries, errors and dead-letter path: a failed one comes back
        alone, in a later batch.

        Batch kinds are fetched by a loop of their own (``"batch": true``, ``kinds`` = the
        batch handlers' kinds), one batch per fetch, while fewer than ``batch_concurrency``
        (default 1) batches run; batches take none of the ``concurrency`` slots of plain
        handlers, and sync batch handlers run in a thread pool of ``batch_concurrency``
        threads of their own. Every job of a running batch is heartbeated; on stop a running
        batch gets the grace period like a running job, then its unfinished jobs are released.
        The batch times out at the shortest ``timeout`` of its jobs (every job without an
        outcome fails with class ``timeout``); a job whose lease is lost while the batch runs
        has ``lease_lost`` set and its outcome dropped (the handler is cancelled only when
        every job's lease is lost)."""

        def register(fn: F) -> F:
            self.add_batch_handler(kind, fn)
            return fn

        return register

    def add_batch_handler(self, kind: str, fn: BatchHandler) -> None:
        _check_handler(kind, fn)
        if kind in self._handlers:
            raise ValueError(f"kind {kind!r} already has a handler (not a batch handler)")
        self._batch_handlers[kind] = fn
        self._batch_is_async[kind] = _is_async(fn)

    @property
    def kinds(self) -> List[str]:
        """The kinds with a (plain) handler: what plain fetches ask for."""
        return sorted(self._handlers)

    @property
    def batch_kinds(self) -> List[str]:
        """The kinds with a batch handler: what batch fetches ask for."""
        return sorted(self._batch_handlers)

    # --- Running ----------------------------------------------------------------------------

    def run(self) -> None:
        """Runs until SIGTERM/SIGINT or ``stop()``, then drains and returns. Raises
        ``Unauthorized``/``Forbidden`` (or another ``ConveyorError`` the server answers to a
        well-formed request) when the worker cannot go on."""
        asyncio.run(self.run_async())

    def stop(self) -> None:
        """Starts the graceful stop (thread-safe): no more fetches; running handlers get the
        grace period, then their jobs are released. ``run()`` returns when it is done."""
        loop = self._loop
        if loop is None or not self._running:
            self._stop_requested = True
            return
        if threading.get_ident() == self._loop_thread:
            self._begin_stop()
        else:
            try:
                loop.call_soon_threadsafe(self._begin_stop)
            except RuntimeError:
                pass

    async def run_async(self, *, handle_signals: bool = True) -> None:
        """Runs the worker on the current event loop (see ``run``). With ``handle_signals``,
        SIGTERM and SIGINT start the graceful stop (a second one ends the grace at once)."""
        if not self._handlers and not self._batch_handlers:
            raise ValueError("register at least one handler before running the worker")
        if self._running:
            raise RuntimeError("this worker is already running")
        loop = asyncio.get_running_loop()
        self._setup(loop)
        installed = self._install_signals(loop) if handle_signals else []
        background: List["asyncio.Task[None]"] = []
        try:
            for loop_fn in (self._heartbeat_loop, self._ack_loop, self._registry_loop):
                task = loop.create_task(loop_fn())
                task.add_done_callback(self._background_done)
                background.append(task)
            log.info(
                "worker %s: queues %s, kinds %s, concurrency %d, batch kinds %s, server %s",
                self.worker_id,
                ",".join(self.queues),
                ",".join(self.kinds) or "-",
                self.concurrency,
                ",".join(self.batch_kinds) or "-",
                self._http.endpoint.url,
            )
            if self.on_ready is not None:
                self.on_ready()
            if self._stop_requested:
                self._begin_stop()
            await self._fetch_loops()
            await self._drain()
            if self._fatal is None:
                await self._register(stopping=True)
        finally:
            self._closing = True
            await _cancel_all(background)
            for sig in installed:
                try:
                    loop.remove_signal_handler(sig)
                except Exception:  # noqa: BLE001
                    pass
            for slot in list(self._held.values()):
                if slot.task is not None and not slot.task.done():
                    slot.task.cancel()
            for batch in list(self._batches):
                if batch.task is not None and not batch.task.done():
                    batch.task.cancel()
            self._pool.shutdown()
            self._batch_pool.shutdown()
            await self._http.close()
            self._running = False
            self._stop_requested = False
            self._loop = None
        if self._fatal is not None:
            raise self._fatal

    # --- State ------------------------------------------------------------------------------

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._running = True
        self._http = AsyncTransport(self.url, self.token, ssl_context=self.ssl_context)
        self._pool = _DaemonPool(self.concurrency, "conveyor-handler")
        self._batch_pool = _DaemonPool(self.batch_concurrency, "conveyor-batch")
        self._batches: Set[_Batch] = set()  # batches running (each one batch_concurrency place)
        self._batch_room = asyncio.Event()
        self._held: Dict[str, _Slot] = {}
        self._buffer: Deque[_Slot] = collections.deque()
        self._active = 0  # slots occupying a concurrency place
        self._pending: List[_Slot] = []  # reported, acknowledgement not yet sent
        self._stopping = False
        self._closing = False
        self._forced = False
        self._fatal: Optional[BaseException] = None
        self._stop_event = asyncio.Event()
        self._room = asyncio.Event()
        self._ack_event = asyncio.Event()
        self._changed = asyncio.Event()
        self._unreachable = False
        self._last_found_jobs = False
        self._last_contact = 0.0
        self._avg_handler: Optional[float] = None
        self._avg_round_trip: Optional[float] = None
        self._started_at = format_time(_dt.datetime.now(_dt.timezone.utc))
        self._fetch_prefix = self._fetch_head(self.kinds)
        # A batch fetch: no `max`, so the server's largest (the kind's max_size decides).
        self._batch_fetch_prefix = self._fetch_head(self.batch_kinds) + ',"batch":true'

    def _fetch_head(self, kinds: List[str]) -> str:
        return (
            '{"worker_id":'
            + _wire.dumps(self.worker_id)
            + ',"queues":'
            + _wire.dumps(self.queues)
            + ',"lease_ms":'
            + str(self.lease_ms)
            + ',"kinds":'
            + _wire.dumps(kinds)
            + ',"concurrency":'
            + str(self._capacity())
            + ',"host":'
            + _wire.dumps(self.host)
            + ',"pid":'
            + str(os.getpid())
            + ',"version":'
            + _wire.dumps(f"conveyor-client-python/{__version__}")
        )

    def _capacity(self) -> int:
        """What the registry shows as the worker's concurrency: its slots, and its batch places
        when it has batch handlers."""
        return self.concurrency + (self.batch_concurrency if self._batch_handlers else 0)

    def _busy(self) -> int:
        """Slots and batch places in use (what the registry shows as busy)."""
        return self._active + len(self._batches)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> List[int]:
        installed: List[int] = []
        if threading.current_thread() is not threading.main_thread():
            return installed
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        return installed

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stopping:
            log.warning("%s again: ending the grace period now", name)
            self._forced = True
            self._changed.set()
            return
        log.info("%s: stopping", name)
        self._begin_stop()

    def _obey(self, command: Any) -> None:
        """An operator's command from the server (``conveyor worker stop ID``): ``stop`` starts
        the graceful stop; under ``quiet`` the server simply hands this worker no jobs."""
        if command == "stop" and not self._stopping:
            log.info("worker %s told to stop by an operator: draining", self.worker_id)
            self._begin_stop()

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._stop_event.set()
        self._room.set()
        self._batch_room.set()
        self._ack_event.set()
        self._changed.set()

    def _die(self, exc: BaseException) -> None:
        """A condition the worker cannot work through (401, 403, a refused request)."""
        if self._fatal is None:
            if isinstance(exc, Unauthorized):
                exc.message += " (the server refuses the worker's token: give a valid one)"
            elif isinstance(exc, Forbidden):
                exc.message += " (the worker's token needs the worker or admin role)"
            self._fatal = exc
            log.error("worker %s stops: %s", self.worker_id, exc)
        self._forced = True
        self._begin_stop()

    def _background_done(self, task: "asyncio.Task[None]") -> None:
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        if exc is not None:
            log.error("worker task %s failed", task.get_name(), exc_info=exc)
            self._die(exc)

    def _room_left(self) -> int:
        return self.concurrency + self._prefetch_limit() - self._active - len(self._buffer)

    def _prefetch_limit(self) -> int:
        """Jobs to hold ahead of free slots now."""
        if isinstance(self.prefetch, int):
            return self.prefetch
        if self._avg_handler is None or self._avg_round_trip is None:
            return 0
        per_slot = 2 * self._avg_round_trip / max(self._avg_handler, 1e-6)
        return min(MAX_AUTO_PREFETCH, math.ceil(self.concurrency * per_slot))

    def _worth_fetching(self) -> bool:
        """A free slot with nothing buffered: fetch now. Only prefetch room: wait until a
        worthwhile batch fits (half of what may be held), not one job per fetch."""
        room = self._room_left()
        if room <= 0:
            return False
        if self._active < self.concurrency and not self._buffer:
            return True
        return room >= max(1, math.ceil((self.concurrency + self._prefetch_limit()) / 2))

    # --- Fetching ---------------------------------------------------------------------------

    def _take_acks(self) -> List[_Slot]:
        """Up to MAX_ACK_BATCH pending acknowledgements (the server takes 10,000 a request)."""
        if len(self._pending) <= MAX_ACK_BATCH:
            pending, self._pending = self._pending, []
        else:
            pending, self._pending = self._pending[:MAX_ACK_BATCH], self._pending[MAX_ACK_BATCH:]
            self._ack_event.set()
        return pending

    def _restore_acks(self, slots: List[_Slot], *, maybe_applied: bool) -> None:
        for slot in slots:
            if maybe_applied:
                slot.retransmitted = True
        live = [s for s in slots if s.key in self._held]
        self._pending[:0] = live
        if live:
            self._ack_event.set()

    @staticmethod
    def _ack_body_parts(slots: List[_Slot]) -> Tuple[List[_Slot], str]:
        """Completions first, then failures (the order the server answers them in)."""
        completes = [s for s in slots if s.ack_kind == "complete"]
        fails = [s for s in slots if s.ack_kind == "fail"]
        text = ""
        if completes:
            text += ',"complete":[' + ",".join(s.ack for s in completes) + "]"
        if fails:
            text += ',"fail":[' + ",".join(s.ack for s in fails) + "]"
        return completes + fails, text

    async def _fetch_loop(self) -> None:
        backoff = _Backoff(0.1, self.max_backoff)
        stop_wait = asyncio.ensure_future(self._stop_event.wait())
        request: "Optional[asyncio.Future[Any]]" = None
        try:
            while not self._stopping:
                if not self._worth_fetching():
                    self._room.clear()
                    await self._room.wait()
                    continue
                # Let handlers that just finished report, so one fetch carries them all.
                await asyncio.sleep(0)
                if self._stopping:
                    break
                if not self._worth_fetching():
                    continue
                room = min(MAX_FETCH, self._room_left())
                # Acknowledgements ride on a fetch while the queue is busy (the last one found
                # jobs), and that fetch answers at once (no long-poll): their answers come now,
                # and a poll cut off at shutdown carries nothing to send again. While the queue
                # is idle the ack loop sends them by themselves.
                taken = self._take_acks() if self._last_found_jobs else []
                acks, ack_text = self._ack_body_parts(taken)
                body = (
                    self._fetch_prefix
                    + ',"max":'
                    + str(room)
                    + ',"wait_ms":'
                    + ("0" if acks else str(self.poll_wait_ms))
                    + ',"busy":'
                    + str(self._busy())
                    + ack_text
                    + "}"
                ).encode("utf-8")
                sent = time.monotonic()
                request = asyncio.ensure_future(
                    self._http.request_bytes("POST", "/v1/fetch", body, timeout=self.poll_wait_ms / 1000 + 30)
                )
                await asyncio.wait([request, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                if not request.done():
                    # Stopping: a fetch that is long-polling an idle queue is given up at
                    # once (nothing was claimed); one that is claiming gets a moment.
                    await asyncio.wait([request], timeout=0.25)
                    if not request.done():
                        request.cancel()
                        await asyncio.wait([request])
                    if request.cancelled():
                        self._restore_acks(acks, maybe_applied=True)
                        break
                try:
                    answer = request.result()
                except ConveyorError as exc:
                    verdict = self._judge(exc, acks, "fetch")
                    if verdict == "retry":
                        self._restore_acks(acks, maybe_applied=True)
                        await self._pause(backoff, exc)
                        continue
                    if verdict == "repaired":
                        continue
                    break
                backoff.reset()
                self._reachable()
                self._last_contact = time.monotonic()
                if not isinstance(answer, dict):
                    continue
                self._apply_ack_results(acks, answer.get("acks"))
                self._obey(answer.get("command"))
                jobs = answer.get("jobs") or []
                self._last_found_jobs = bool(jobs)
                if len(jobs) >= room:
                    # A full answer did not wait for jobs: a round trip's true cost.
                    self._avg_round_trip = _ewma(self._avg_round_trip, time.monotonic() - sent)
                if jobs:
                    self._accept(jobs)
        finally:
            stop_wait.cancel()
            if request is not None and not request.done():
                request.cancel()

    async def _fetch_loops(self) -> None:
        """The plain fetch loop (with plain handlers) and the batch fetch loop (with batch
        handlers), until both end (stopping, or a fatal error)."""
        loops: List["asyncio.Task[None]"] = []
        if self._handlers:
            loops.append(asyncio.ensure_future(self._fetch_loop()))
        if self._batch_handlers:
            loops.append(asyncio.ensure_future(self._batch_fetch_loop()))
        try:
            await asyncio.gather(*loops)
        except BaseException:
            await _cancel_all(loops)
            raise

    async def _batch_fetch_loop(self) -> None:
        """Fetches one batch at a time (``"batch": true``, long-polling until a batch of one of
        the batch kinds is ready) while fewer than ``batch_concurrency`` batches run. Its
        fetches carry no acknowledgements (the plain fetches and the ack loop send them)."""
        backoff = _Backoff(0.1, self.max_backoff)
        stop_wait = asyncio.ensure_future(self._stop_event.wait())
        request: "Optional[asyncio.Future[Any]]" = None
        try:
            while not self._stopping:
                if len(self._batches) >= self.batch_concurrency:
                    self._batch_room.clear()
                    await self._batch_room.wait()
                    continue
                body = (
                    self._batch_fetch_prefix
                    + ',"wait_ms":'
                    + str(self.poll_wait_ms)
                    + ',"busy":'
                    + str(self._busy())
                    + "}"
                ).encode("utf-8")
                request = asyncio.ensure_future(
                    self._http.request_bytes("POST", "/v1/fetch", body, timeout=self.poll_wait_ms / 1000 + 30)
                )
                await asyncio.wait([request, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                if not request.done():
                    # Stopping: as in the plain fetch loop, an idle long-poll is given up.
                    await asyncio.wait([request], timeout=0.25)
                    if not request.done():
                        request.cancel()
                        await asyncio.wait([request])
                    if request.cancelled():
                        break
                try:
                    answer = request.result()
                except ConveyorError as exc:
                    if self._judge(exc, [], "batch fetch") == "retry":
                        await self._pause(backoff, exc)
                        continue
                    break
                backoff.reset()
                self._reachable()
                self._last_contact = time.monotonic()
                if not isinstance(answer, dict):
                    continue
                self._obey(answer.get("command"))
                jobs = answer.get("jobs") or []
                if jobs:
                    slots = self._hold(jobs)
                    if self._stopping:
                        # Claimed as the stop began: back at once, never started.
                        await self._release(slots)
                        break
                    self._start_batches(slots)
        finally:
            stop_wait.cancel()
            if request is not None and not request.done():
                request.cancel()

    async def _pause(self, backoff: _Backoff, exc: BaseException) -> None:
        delay = backoff.next_delay()
        if not self._unreachable:
            self._unreachable = True
            log.warning("server unreachable (%s); retrying with backoff", exc)
        else:
            log.debug("server still unreachable (%s); next try in %.2f s", exc, delay)
        try:
            await asyncio.wait_for(self._stop_event.wait(), delay)
        except asyncio.TimeoutError:
            pass

    def _reachable(self) -> None:
        if self._unreachable:
            self._unreachable = False
            log.warning("server reachable again")

    def _judge(self, exc: ConveyorError, acks: List[_Slot], what: str) -> str:
        """What a failed request means: ``retry`` (network, 5xx, 408, 429: back off and send it
        again), ``repaired`` (one acknowledgement the server refuses was replaced: send again
        now) or ``fatal`` (401, 403, or a refusal the worker cannot fix: it stops)."""
        if isinstance(exc, (TransportError, ServerError)) or exc.status in (408, 429):
            return "retry"
        if isinstance(exc, (Unauthorized, Forbidden)):
            self._die(exc)
            return "fatal"
        if isinstance(exc, (InvalidRequest, PayloadTooLarge)) and self._repair_acks(acks, exc):
            return "repaired"
        self._die(self._refused(what, exc))
        return "fatal"

    def _refused(self, what: str, exc: ConveyorError) -> ConveyorError:
        hint = ""
        if exc.status in (400, 404) and what == "batch fetch":
            hint = " (is the server older than this client? batch handlers need batch fetches)"
        elif exc.status in (400, 404):
            hint = " (is the server older than this client? it needs the batched lease protocol)"
        exc.message = f"the server refused the worker's {what} request: {exc.message}{hint}"
        return exc

    def _accept(self, jobs: List[Dict[str, Any]]) -> None:
        self._buffer.extend(self._hold(jobs))
        self._pump()

    def _hold(self, jobs: List[Dict[str, Any]]) -> List[_Slot]:
        """Slots for the jobs a fetch answered, held (heartbeated) from now on."""
        slots: List[_Slot] = []
        for data in jobs:
            try:
                job = LeasedJob(data)
            except (KeyError, TypeError):
                log.error("the server sent a malformed job: %r", data)
                continue
            slot = _Slot(job)
            job._reporter = functools.partial(self._progress, slot)
            self._held[slot.key] = slot
            slots.append(slot)
        return slots

    def _pump(self) -> None:
        """Starts buffered jobs while there are free slots."""
        while self._buffer and self._active < self.concurrency and not self._stopping:
            self._start(self._buffer.popleft())

    # --- Running handlers -------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        job = slot.job
        slot.phase = _RUNNING
        slot.occupying = True
        slot.started = time.monotonic()
        self._active += 1
        fn = self._handlers.get(job.kind)
        if fn is None:
            self._report(
                slot,
                "fail",
                {
                    "error": {
                        "class": "unknown_kind",
                        "message": f"worker {self.worker_id} has no handler for kind {job.kind!r}",
                    },
                    "retry": "auto",
                },
            )
            self._release_place(slot)
            return
        loop = self._loop
        assert loop is not None
        if job.timeout_ms:
            slot.timer = loop.call_later(job.timeout_ms / 1000, self._time_out, slot)
        if self._is_async[job.kind]:
            slot.task = loop.create_task(self._run_async_handler(slot, fn))
            slot.task.add_done_callback(functools.partial(self._task_ended, slot))
        else:
            self._pool.submit(lambda: self._run_sync_handler(slot, fn, loop))

    async def _run_async_handler(self, slot: _Slot, fn: Handler) -> None:
        job = slot.job
        try:
            with _trace.handler_span(job.kind, job.id, job.traceparent, job.tracestate):
                result = fn(job)
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError as exc:
            if slot.timed_out:
                self._finish(slot, self._timeout_outcome(slot))
            elif slot.lost or slot.abandoned:
                self._finish(slot, None)  # nothing to report
            elif self._closing:
                self._finish(slot, None)
                raise
            else:
                # Not our doing: a cancellation escaping the handler is its failure.
                self._finish(slot, self._failure(exc))
            return
        except Exception as exc:  # noqa: BLE001 - every handler error is the job's failure
            self._finish(slot, self._timeout_outcome(slot) if slot.timed_out else self._failure(exc))
            return
        self._finish(slot, self._timeout_outcome(slot) if slot.timed_out else self._completion(result))

    def _run_sync_handler(self, slot: _Slot, fn: Handler, loop: asyncio.AbstractEventLoop) -> None:
        job = slot.job
        try:
            with _trace.handler_span(job.kind, job.id, job.traceparent, job.tracestate):
                result = fn(job)
                if inspect.isawaitable(result):
                    result = asyncio.run_coroutine_threadsafe(_await(result), loop).result()
            outcome = self._completion(result)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler fails the job
            outcome = self._failure(exc)
        try:
            loop.call_soon_threadsafe(self._finish, slot, outcome)
        except RuntimeError:
            pass  # the loop is gone: the worker stopped and released the job

    def _task_ended(self, slot: _Slot, _task: "asyncio.Task[None]") -> None:
        """A task cancelled before it ever ran never reaches its own bookkeeping."""
        if slot.phase != _DONE:
            self._finish(slot, self._timeout_outcome(slot) if slot.timed_out else None)

    def _time_out(self, slot: _Slot) -> None:
        slot.timer = None
        if slot.reported or slot.phase != _RUNNING:
            return
        slot.timed_out = True
        if slot.task is not None:
            slot.task.cancel()
        else:
            # A thread cannot be stopped: report now, drop whatever it returns later.
            self._report_outcome(slot, self._timeout_outcome(slot))

    @staticmethod
    def _timeout_outcome(slot: _Slot) -> Tuple[str, Dict[str, Any]]:
        return (
            "fail",
            {
                "error": {
                    "class": "timeout",
                    "message": f"the handler ran longer than the job's timeout of {slot.job.timeout_ms} ms",
                },
                "retry": "auto",
            },
        )

    @staticmethod
    def _completion(result: Any) -> Tuple[str, Dict[str, Any]]:
        return ("complete", {"result": result})

    @staticmethod
    def _failure(exc: BaseException) -> Tuple[str, Dict[str, Any]]:
        if isinstance(exc, Permanent):
            error: Dict[str, Any] = {"message": exc.message or "permanent failure"}
            if exc.error_class:
                error["class"] = _CLASS_CHARS.sub("_", exc.error_class)[:128] or "permanent"
            return ("fail", {"error": error, "retry": "never"})
        if isinstance(exc, RetryAfter):
            error = {"message": exc.message or "retry later"}
            if exc.error_class:
                error["class"] = _CLASS_CHARS.sub("_", exc.error_class)[:128] or "retry_after"
            return (
                "fail",
                {"error": error, "retry": "after", "retry_after_ms": int(round(exc.seconds * 1000))},
            )
        if isinstance(exc, Retry):
            error = {"message": exc.message or "retry"}
            if exc.error_class:
                error["class"] = _CLASS_CHARS.sub("_", exc.error_class)[:128] or "error"
            return ("fail", {"error": error, "retry": "auto"})
        # The exception's own line as the message, the whole traceback beside it: the server
        # keeps it with the attempt (shown in the job's history).
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        return (
            "fail",
            {
                "error": {
                    "class": error_class_name(exc),
                    "message": _clip(summary) or type(exc).__name__,
                    "backtrace": text[:_MAX_BACKTRACE],
                },
                "retry": "auto",
            },
        )

    def _finish(self, slot: _Slot, outcome: Optional[Tuple[str, Dict[str, Any]]]) -> None:
        """A handler ended (on the loop's thread)."""
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        if slot.phase == _RUNNING and slot.started:
            self._avg_handler = _ewma(self._avg_handler, time.monotonic() - slot.started)
        slot.phase = _DONE
        if outcome is not None and not slot.reported:
            if slot.lost:
                log.warning(
                    "job %s (%s): lease lost while it ran (cancelled, or rescued after its lease "
                    "expired); its result is dropped",
                    slot.job.id,
                    slot.job.kind,
                )
            elif slot.abandoned:
                log.info(
                    "job %s (%s) finished after it was released; its result is dropped",
                    slot.job.id,
                    slot.job.kind,
                )
            else:
                self._report_outcome(slot, outcome)
        slot.reported = True
        if slot.lost or slot.abandoned:
            self._held.pop(slot.key, None)
        self._release_place(slot)

    def _release_place(self, slot: _Slot) -> None:
        if slot.occupying:
            slot.occupying = False
            self._active -= 1
            self._changed.set()
            self._pump()
            self._room.set()

    def _report_outcome(self, slot: _Slot, outcome: Tuple[str, Dict[str, Any]]) -> None:
        kind, fields = outcome
        self._report(slot, kind, fields)

    def _report(self, slot: _Slot, kind: str, fields: Dict[str, Any]) -> None:
        """Queues the job's acknowledgement (pre-encoded, so a result that is no JSON fails the
        job here rather than the whole batch)."""
        slot.reported = True
        head = '{"id":' + _wire.dumps(slot.job.id) + ',"lease_token":' + _wire.dumps(slot.job.lease_token)
        if kind == "complete":
            result = fields.get("result")
            if result is None:
                slot.ack = head + "}"
            else:
                try:
                    slot.ack = head + ',"result":' + _wire.dumps(result) + "}"
                except (TypeError, ValueError) as exc:
                    kind = "fail"
                    fields = {
                        "error": {
                            "class": "invalid_result",
                            "message": f"the handler's result is not JSON: {type(exc).__name__}: {exc}",
                        },
                        "retry": "auto",
                    }
        if kind == "fail":
            rest = _wire.dumps(fields)
            slot.ack = head + "," + rest[1:]
        slot.ack_kind = kind
        self._pending.append(slot)
        self._ack_event.set()
        self._changed.set()

    # --- Running batches --------------------------------------------------------------------

    def _start_batches(self, slots: List[_Slot]) -> None:
        """Starts the batch a batch fetch answered (the server answers one kind per batch; jobs
        of several kinds, were it to send them, would run as one batch per kind)."""
        by_kind: Dict[str, List[_Slot]] = {}
        for slot in slots:
            by_kind.setdefault(slot.job.kind, []).append(slot)
        for kind, group in by_kind.items():
            self._start_batch(_Batch(kind, group))

    def _start_batch(self, batch: _Batch) -> None:
        for slot in batch.slots:
            slot.phase = _RUNNING
            slot.batch = batch
        self._batches.add(batch)
        fn = self._batch_handlers.get(batch.kind)
        if fn is None:
            outcome: Outcome = (
                "fail",
                {
                    "error": {
                        "class": "unknown_kind",
                        "message": f"worker {self.worker_id} has no batch handler for kind {batch.kind!r}",
                    },
                    "retry": "auto",
                },
            )
            self._finish_batch(batch, [outcome] * len(batch.slots))
            return
        loop = self._loop
        assert loop is not None
        timeouts = [slot.job.timeout_ms for slot in batch.slots if slot.job.timeout_ms]
        if timeouts:
            batch.timeout_ms = min(timeouts)
            batch.timer = loop.call_later(batch.timeout_ms / 1000, self._time_out_batch, batch)
        if self._batch_is_async[batch.kind]:
            batch.task = loop.create_task(self._run_async_batch(batch, fn))
            batch.task.add_done_callback(functools.partial(self._batch_task_ended, batch))
        else:
            self._batch_pool.submit(lambda: self._run_sync_batch(batch, fn, loop))

    async def _run_async_batch(self, batch: _Batch, fn: BatchHandler) -> None:
        size = len(batch.slots)
        try:
            with _trace.batch_span(batch.kind, batch.jobs):
                result = fn(batch.jobs)
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError as exc:
            if batch.timed_out:
                self._finish_batch(batch, self._batch_timeout_outcomes(batch))
            elif batch.abandoned or batch.all_lost:
                self._finish_batch(batch, None)  # nothing to report
            elif self._closing:
                self._finish_batch(batch, None)
                raise
            else:
                # Not our doing: a cancellation escaping the handler is every job's failure.
                self._finish_batch(batch, [self._failure(exc)] * size)
            return
        except Exception as exc:  # noqa: BLE001 - a handler error is every job's failure
            if batch.timed_out:
                self._finish_batch(batch, self._batch_timeout_outcomes(batch))
            else:
                self._finish_batch(batch, [self._failure(exc)] * size)
            return
        if batch.timed_out:
            self._finish_batch(batch, self._batch_timeout_outcomes(batch))
        else:
            self._finish_batch(batch, self._batch_outcomes(batch, result))

    def _run_sync_batch(self, batch: _Batch, fn: BatchHandler, loop: asyncio.AbstractEventLoop) -> None:
        try:
            with _trace.batch_span(batch.kind, batch.jobs):
                result = fn(batch.jobs)
                if inspect.isawaitable(result):
                    result = asyncio.run_coroutine_threadsafe(_await(result), loop).result()
            outcomes = self._batch_outcomes(batch, result)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler fails the jobs
            outcomes = [self._failure(exc)] * len(batch.slots)
        try:
            loop.call_soon_threadsafe(self._finish_batch, batch, outcomes)
        except RuntimeError:
            pass  # the loop is gone: the worker stopped and released the jobs

    def _batch_outcomes(self, batch: _Batch, result: Any) -> List[Outcome]:
        """The handler's return value as one outcome per job of the batch, in order."""
        size = len(batch.slots)
        if result is None:
            return [self._completion(None)] * size
        items: Optional[List[Any]] = None
        if not isinstance(result, (str, bytes, bytearray, Mapping)):
            try:
                items = list(result)
            except TypeError:
                items = None
        if items is None:
            invalid: Outcome = (
                "fail",
                {
                    "error": {
                        "class": "invalid_result",
                        "message": "the batch handler must return a list of outcomes, one per job "
                        f"(or None), not {type(result).__name__}",
                    },
                    "retry": "auto",
                },
            )
            return [invalid] * size
        if len(items) > size:
            log.error(
                "batch of %d job(s) of kind %s: the batch handler returned %d outcome(s); the %d "
                "past the last job are ignored",
                size,
                batch.kind,
                len(items),
                len(items) - size,
            )
        outcomes: List[Outcome] = []
        missing: Optional[Outcome] = None
        for index in range(size):
            if index < len(items):
                item = items[index]
                if isinstance(item, BaseException):
                    outcomes.append(self._failure(item))
                else:
                    outcomes.append(self._completion(item))
                continue
            if missing is None:
                missing = (
                    "fail",
                    {
                        "error": {
                            "class": "missing_outcome",
                            "message": f"the batch handler returned {len(items)} outcome(s) for a "
                            f"batch of {size}",
                        },
                        "retry": "auto",
                    },
                )
            outcomes.append(missing)
        return outcomes

    def _batch_task_ended(self, batch: _Batch, _task: "asyncio.Task[None]") -> None:
        """A task cancelled before it ever ran never reaches its own bookkeeping."""
        if not batch.finished:
            self._finish_batch(batch, self._batch_timeout_outcomes(batch) if batch.timed_out else None)

    def _time_out_batch(self, batch: _Batch) -> None:
        batch.timer = None
        if batch.finished:
            return
        batch.timed_out = True
        if batch.task is not None:
            batch.task.cancel()
        else:
            # A thread cannot be stopped: report now, drop whatever it returns later.
            for slot, outcome in zip(batch.slots, self._batch_timeout_outcomes(batch)):
                if not slot.reported and not slot.lost and not slot.abandoned:
                    self._report_outcome(slot, outcome)

    @staticmethod
    def _batch_timeout_outcomes(batch: _Batch) -> List[Outcome]:
        outcome: Outcome = (
            "fail",
            {
                "error": {
                    "class": "timeout",
                    "message": f"the batch handler ran longer than the batch's timeout of "
                    f"{batch.timeout_ms} ms (the shortest of its jobs')",
                },
                "retry": "auto",
            },
        )
        return [outcome] * len(batch.slots)

    def _finish_batch(self, batch: _Batch, outcomes: Optional[List[Outcome]]) -> None:
        """A batch handler ended (on the loop's thread): each job's outcome, as ``_finish``
        reports a job's (dropped for a job whose lease was lost or that was released)."""
        if batch.finished:
            return
        batch.finished = True
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        self._batches.discard(batch)
        for index, slot in enumerate(batch.slots):
            self._finish(slot, outcomes[index] if outcomes is not None else None)
        self._changed.set()
        self._batch_room.set()

    # --- Progress ---------------------------------------------------------------------------

    def _progress(
        self, slot: _Slot, _job: LeasedJob, percent: int, message: Optional[str]
    ) -> Awaitable[None]:
        """``job.progress()``: on the worker's loop (an async handler) a task to await (it runs
        whether awaited or not); on another thread (a sync handler) the report is sent on the
        loop and waited for."""
        loop = self._loop
        if loop is None or not self._running or self._closing:
            raise RuntimeError("progress() needs the worker running")
        body: Dict[str, Any] = {"lease_token": slot.job.lease_token, "progress": percent}
        if message is not None:
            body["message"] = message
        if threading.get_ident() == self._loop_thread:
            task = loop.create_task(self._send_progress(slot, body))
            task.add_done_callback(functools.partial(_progress_done, slot.job.id))
            return task
        asyncio.run_coroutine_threadsafe(self._send_progress(slot, body), loop).result(60)
        return _Done()

    async def _send_progress(self, slot: _Slot, body: Dict[str, Any]) -> None:
        try:
            await self._http.request("POST", _wire.job_path(slot.job.id, "progress"), body, timeout=30)
        except LeaseLost:
            # What the next heartbeat would find: the handler's result would be dropped.
            if slot.key in self._held and not slot.reported and not slot.lost:
                self._lose(slot, "lease_lost")
            raise

    # --- Acknowledgements -------------------------------------------------------------------

    def _apply_ack_results(self, slots: List[_Slot], results: Any) -> None:
        if not slots:
            return
        if not isinstance(results, list):
            results = []
        by_id = {r.get("id"): r for r in results if isinstance(r, dict)}
        for index, slot in enumerate(slots):
            result = results[index] if index < len(results) and isinstance(results[index], dict) else None
            if result is None or result.get("id") != slot.job.id:
                result = by_id.get(slot.job.id)
            status = result.get("status") if result else None
            self._held.pop(slot.key, None)
            if status == "ok":
                continue
            if status is None:
                log.warning("job %s: the server answered nothing for its acknowledgement", slot.job.id)
            elif slot.retransmitted and status == "lease_lost":
                log.debug(
                    "job %s: acknowledgement resent after a broken connection answered lease_lost "
                    "(the first one was most likely applied)",
                    slot.job.id,
                )
            elif status == "lease_lost":
                log.warning(
                    "job %s (%s): lease lost (cancelled, finished, or rescued after its lease "
                    "expired); its %s is dropped",
                    slot.job.id,
                    slot.job.kind,
                    "result" if slot.ack_kind == "complete" else "failure",
                )
            else:
                log.warning(
                    "job %s (%s): acknowledgement answered %s; dropped", slot.job.id, slot.job.kind, status
                )

    def _repair_acks(self, slots: List[_Slot], exc: ConveyorError) -> bool:
        """The server refused a request for one acknowledgement (e.g. a result over the size
        limit, ``complete[3].result``): report that job's failure instead (or, if even that is
        refused, leave it to its lease) and send the others again."""
        match = _ACK_FIELD.match(exc.field or "")
        if not match:
            return False
        group = [s for s in slots if s.ack_kind == match.group(1)]
        index = int(match.group(2))
        if index >= len(group):
            return False
        bad = group[index]
        others = [s for s in slots if s is not bad]
        if bad.replaced:
            log.error(
                "job %s: the server refuses its acknowledgement (%s); left to its lease", bad.job.id, exc
            )
            self._held.pop(bad.key, None)
        else:
            bad.replaced = True
            log.warning(
                "job %s: the server refused its acknowledgement (%s); reporting a failure instead",
                bad.job.id,
                exc,
            )
            self._report(
                bad,
                "fail",
                {
                    "error": {
                        "class": "invalid_result" if bad.ack_kind == "complete" else "error",
                        "message": _clip(f"the server refused this job's acknowledgement: {exc}", 4096),
                    },
                    "retry": "auto",
                },
            )
        self._restore_acks(others, maybe_applied=False)
        return True

    async def _ack_loop(self) -> None:
        backoff = _Backoff(0.1, self.max_backoff)
        while not self._closing:
            await self._ack_event.wait()
            self._ack_event.clear()
            if not self._pending:
                continue
            if not self._stopping and self.ack_delay > 0:
                await asyncio.sleep(self.ack_delay)
                if not self._pending:
                    continue  # a fetch carried them
            outcome = await self._send_acks()
            if outcome == "fatal":
                return
            if outcome == "ok":
                backoff.reset()
            else:
                await asyncio.sleep(backoff.next_delay())
                self._ack_event.set()

    async def _send_acks(self) -> str:
        """One ``POST /v1/ack`` with everything pending: ``ok``, ``retry`` (put back, to be
        sent again) or ``fatal``."""
        acks, text = self._ack_body_parts(self._take_acks())
        if not acks:
            return "ok"
        body = ("{" + text[1:] + "}").encode("utf-8")
        try:
            answer = await self._http.request_bytes("POST", "/v1/ack", body, timeout=30)
        except ConveyorError as exc:
            verdict = self._judge(exc, acks, "ack")
            if verdict == "retry":
                self._restore_acks(acks, maybe_applied=True)
                log.debug("acknowledgements not sent (%s)", exc)
                return "retry"
            return "ok" if verdict == "repaired" else "fatal"
        self._reachable()
        self._apply_ack_results(acks, answer.get("results") if isinstance(answer, dict) else None)
        return "ok"

    # --- The worker registry ---------------------------------------------------------------

    async def _registry_loop(self) -> None:
        """Fetches and heartbeats (with ``worker_id``) keep the worker registered; when neither
        went out for REGISTRY_INTERVAL (all slots busy under a long lease), it reports itself
        here, or the server would think it dead after ``--worker-stale-secs`` and rescue its
        jobs."""
        while not self._closing:
            await asyncio.sleep(REGISTRY_INTERVAL)
            if time.monotonic() - self._last_contact >= REGISTRY_INTERVAL:
                await self._register(stopping=False)

    async def _register(self, *, stopping: bool) -> None:
        body = {
            "worker_id": self.worker_id,
            "host": self.host[:256],
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": self._capacity(),
            "busy": self._busy(),
            "version": f"conveyor-client-python/{__version__}",
            "started_at": self._started_at,
            "stopping": stopping,
        }
        try:
            answer = await self._http.request("POST", "/v1/workers/heartbeat", body, timeout=5)
            if not stopping and isinstance(answer, dict):
                self._obey(answer.get("command"))
        except (Unauthorized, Forbidden) as exc:
            if not stopping:
                self._die(exc)
        except ConveyorError as exc:
            log.debug("worker registry heartbeat failed: %s", exc)

    # --- Heartbeats -------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = max(0.05, self.lease / 3)
        while not self._closing:
            await asyncio.sleep(interval)
            slots = [s for s in self._held.values() if not s.lost and not s.abandoned]
            for start in range(0, len(slots), MAX_HEARTBEAT_BATCH):
                chunk = slots[start : start + MAX_HEARTBEAT_BATCH]
                body = {
                    "leases": [s.lease_json() for s in chunk],
                    "lease_ms": self.lease_ms,
                    "worker_id": self.worker_id,
                    "busy": self._busy(),
                }
                try:
                    answer = await self._http.request(
                        "POST", "/v1/heartbeat", body, timeout=max(5.0, self.lease)
                    )
                except ConveyorError as exc:
                    if self._judge(exc, [], "heartbeat") == "retry":
                        log.debug("heartbeat failed (%s); next one in %.2f s", exc, interval)
                        break
                    return
                self._last_contact = time.monotonic()
                results = answer.get("results") if isinstance(answer, dict) else None
                self._apply_heartbeats(chunk, results if isinstance(results, list) else [])

    def _apply_heartbeats(self, slots: List[_Slot], results: List[Any]) -> None:
        by_id = {r.get("id"): r for r in results if isinstance(r, dict)}
        for index, slot in enumerate(slots):
            result = results[index] if index < len(results) and isinstance(results[index], dict) else None
            if result is None or result.get("id") != slot.job.id:
                result = by_id.get(slot.job.id)
            if not result:
                continue
            status = result.get("status")
            if status == "ok":
                expires = result.get("lease_expires_at")
                if expires:
                    slot.job.lease_expires_at = expires
                continue
            if slot.key not in self._held or slot.reported:
                # Its acknowledgement is on its way (or answered): that answer tells.
                continue
            self._lose(slot, status)

    def _lose(self, slot: _Slot, status: Any) -> None:
        slot.lost = True
        slot.job._lost = True
        if slot.phase == _BUFFERED:
            try:
                self._buffer.remove(slot)
            except ValueError:
                pass
            self._held.pop(slot.key, None)
            log.warning(
                "job %s (%s): lease %s before it started; dropped", slot.job.id, slot.job.kind, status
            )
            self._room.set()
            return
        if slot.batch is not None:
            batch = slot.batch
            log.warning(
                "job %s (%s): heartbeat answered %s (cancelled, or rescued after its lease "
                "expired); %s, its outcome will be dropped",
                slot.job.id,
                slot.job.kind,
                status,
                "its batch handler is cancelled (every job of the batch is lost)"
                if batch.all_lost and batch.task is not None
                else "its batch handler runs on",
            )
            if batch.all_lost and batch.task is not None and not batch.task.done():
                batch.task.cancel()
            return
        log.warning(
            "job %s (%s): heartbeat answered %s (cancelled, or rescued after its lease expired); "
            "%s, its result will be dropped",
            slot.job.id,
            slot.job.kind,
            status,
            "its handler is cancelled" if slot.task is not None else "the handler runs on",
        )
        if slot.task is not None and not slot.task.done():
            slot.task.cancel()

    # --- Stopping ---------------------------------------------------------------------------

    async def _drain(self) -> None:
        if self._fatal is not None:
            return
        started = time.monotonic()
        deadline = started + self.grace_period
        # Jobs fetched ahead and never started go back at once.
        buffered = list(self._buffer)
        self._buffer.clear()
        running = [s for s in self._held.values() if s.phase == _RUNNING and not s.reported]
        if running:
            log.info(
                "draining: %d running job(s) get up to %.1f s to finish", len(running), self.grace_period
            )
        await self._release(buffered)
        while self._fatal is None and not self._forced:
            running = [s for s in self._held.values() if s.phase == _RUNNING and not s.reported]
            remaining = deadline - time.monotonic()
            if not running or remaining <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        if self._fatal is not None:
            return
        left = [s for s in self._held.values() if s.phase == _RUNNING and not s.reported]
        for slot in left:
            slot.abandoned = True
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()
        for batch in list(self._batches):
            batch.abandoned = True
            if batch.task is not None and not batch.task.done():
                batch.task.cancel()
        if left:
            log.warning(
                "grace period over: releasing %d unfinished job(s): %s",
                len(left),
                ", ".join(s.job.id for s in left),
            )
        await self._release(left)
        await self._flush_final()

    async def _release(self, slots: Iterable[_Slot]) -> None:
        slots = list(slots)
        if not slots:
            return

        async def one(slot: _Slot) -> None:
            backoff = _Backoff(0.1, 1.0)
            for _ in range(5):
                try:
                    await self._http.request(
                        "POST",
                        _wire.job_path(slot.job.id, "release"),
                        {"lease_token": slot.job.lease_token},
                        timeout=10,
                    )
                    break
                except (TransportError, ServerError) as exc:
                    log.debug("release of job %s failed (%s)", slot.job.id, exc)
                    await asyncio.sleep(backoff.next_delay())
                except ConveyorError as exc:
                    log.warning("release of job %s refused: %s", slot.job.id, exc)
                    break
            self._held.pop(slot.key, None)

        await asyncio.gather(*(one(s) for s in slots))

    async def _flush_final(self) -> None:
        """Sends the acknowledgements still pending, trying for a while if the server is
        away (after that their leases expire and the jobs run again)."""
        deadline = time.monotonic() + max(5.0, min(30.0, self.grace_period))
        backoff = _Backoff(0.1, 1.0)
        while self._pending and self._fatal is None:
            outcome = await self._send_acks()
            if outcome == "retry":
                delay = backoff.next_delay()
                if time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
        if self._pending and self._fatal is None:
            log.warning("%d acknowledgement(s) could not be sent before exiting", len(self._pending))


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class _Done:
    """An awaitable that is already done: what ``job.progress()`` answers on a handler's
    thread, where the report was sent before it returned."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


def _progress_done(job_id: str, task: "asyncio.Task[None]") -> None:
    """Reads a progress report's outcome, so one nobody awaited is no "exception never
    retrieved" (awaiting it still raises)."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.debug("job %s: progress report failed: %s", job_id, exc)


async def _cancel_all(tasks: List["asyncio.Task[None]"]) -> None:
    """Cancels the tasks and waits for them to end; cancels again any that swallowed it
    (``asyncio.wait_for`` before Python 3.12 can lose a cancellation that meets a result)."""
    for _ in range(20):
        pending = [t for t in tasks if not t.done()]
        if not pending:
            break
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.5)
