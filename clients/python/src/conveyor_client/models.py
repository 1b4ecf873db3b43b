"""Typed views of the server's JSON: jobs as read back, jobs to enqueue, and the job a handler
receives."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, TypedDict, Union, cast

from . import _trace

__all__ = [
    "Job",
    "ErrorRecord",
    "Lease",
    "NewJob",
    "LeasedJob",
    "CreatedFlow",
    "FlowView",
    "FlowPage",
    "StepView",
    "StepError",
    "Progress",
    "BreakerSettings",
    "BreakerView",
    "BlockedBy",
    "JobSequence",
    "KeyUsage",
    "Limit",
    "LimitRate",
    "LimitView",
    "SequenceBlockedBy",
    "parse_time",
    "format_time",
]

_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: Optional[str]) -> Optional[_dt.datetime]:
    """An RFC 3339 timestamp as an aware datetime (Python 3.9's ``fromisoformat`` takes neither
    ``Z`` nor millisecond fractions, so they are normalised first)."""
    if value is None:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    parsed = _dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return parsed


def format_time(value: _dt.datetime) -> str:
    """An aware datetime as RFC 3339 in UTC with milliseconds (naive datetimes are refused:
    whether they mean UTC or local time is a guess)."""
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError("run_at must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    utc = value.astimezone(_dt.timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class ErrorRecord:
    """One failed attempt in a job's history."""

    attempt: int
    at: Optional[_dt.datetime]
    error_class: str
    message: str
    #: The worker that ran the attempt, when it started, and the traceback it reported.
    worker_id: Optional[str] = None
    started_at: Optional[_dt.datetime] = None
    backtrace: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ErrorRecord":
        worker = data.get("worker_id")
        backtrace = data.get("backtrace")
        return cls(
            attempt=int(data.get("attempt", 0)),
            at=parse_time(data.get("at")),
            error_class=str(data.get("class", "")),
            message=str(data.get("message", "")),
            worker_id=str(worker) if worker is not None else None,
            started_at=parse_time(data.get("started_at")),
            backtrace=str(backtrace) if backtrace is not None else None,
        )


@dataclass(frozen=True)
class Lease:
    """Who holds a running job and until when."""

    worker_id: str
    expires_at: Optional[_dt.datetime]


@dataclass(frozen=True)
class Job:
    """A job as ``GET /v1/jobs/{id}`` shows it. ``raw`` is the JSON as answered (fields a newer
    server adds are there too); ``job["state"]`` reads it as well.

    ``limit_keys`` are the keys the job holds under the named limits it is subject to, as
    ``LIMIT:VALUE`` (``LIMIT:`` for a limit without a key), stamped at enqueue (empty when it is
    subject to none). ``blocked_by`` is, for an available job a named limit holds back now,
    each of its limit keys with no room left and what uses it (:class:`BlockedBy` dicts), and
    for a ``blocked`` job, the sequence it waits in and the job in front
    (:class:`SequenceBlockedBy`); empty otherwise.

    ``sequence`` is the job's place in its sequence (:class:`JobSequence`: ``key``, ``no``,
    ``on_dead``; ``None`` when it is in none). A job enqueued behind an unfinished one of its
    sequence is ``blocked`` (never fetched) until the one in front finishes.

    ``duplicate`` and ``debounced_into`` are only in an enqueue's answer (``None`` when read
    back): ``debounced_into`` is the id of the job a ``debounce`` or ``throttle`` folded the
    enqueue into (this job; ``duplicate`` is then true)."""

    id: str
    kind: str
    queue: str
    payload: Any
    state: str
    attempt: int
    max_attempts: int
    priority: int = 0
    run_at: Optional[_dt.datetime] = None
    timeout_ms: Optional[int] = None
    idempotency_key: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    tenant: Optional[str] = None
    errors: List[ErrorRecord] = field(default_factory=list)
    lease: Optional[Lease] = None
    result: Any = None
    created_at: Optional[_dt.datetime] = None
    started_at: Optional[_dt.datetime] = None
    finished_at: Optional[_dt.datetime] = None
    unique_key: Optional[str] = None
    duplicate: Optional[bool] = None
    debounced_into: Optional[str] = None
    limit_keys: List[str] = field(default_factory=list)
    blocked_by: List[Union["BlockedBy", "SequenceBlockedBy"]] = field(default_factory=list)
    sequence: Optional["JobSequence"] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Job":
        lease = data.get("lease")
        sequence = data.get("sequence")
        return cls(
            id=str(data["id"]),
            kind=str(data.get("kind", "")),
            queue=str(data.get("queue", "")),
            payload=data.get("payload"),
            state=str(data.get("state", "")),
            attempt=int(data.get("attempt", 0)),
            max_attempts=int(data.get("max_attempts", 0)),
            priority=int(data.get("priority", 0)),
            run_at=parse_time(data.get("run_at")),
            timeout_ms=data.get("timeout_ms"),
            idempotency_key=data.get("idempotency_key"),
            tags=list(data.get("tags") or []),
            tenant=data.get("tenant"),
            errors=[ErrorRecord.from_json(e) for e in data.get("errors") or []],
            lease=(
                Lease(
                    worker_id=str(lease.get("worker_id", "")), expires_at=parse_time(lease.get("expires_at"))
                )
                if isinstance(lease, dict)
                else None
            ),
            result=data.get("result"),
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            unique_key=data.get("unique_key"),
            duplicate=data.get("duplicate"),
            debounced_into=(str(data["debounced_into"]) if data.get("debounced_into") is not None else None),
            limit_keys=[str(k) for k in data.get("limit_keys") or []],
            blocked_by=[
                cast(Union[BlockedBy, SequenceBlockedBy], dict(b))
                for b in data.get("blocked_by") or []
                if isinstance(b, Mapping)
            ],
            sequence=cast(JobSequence, dict(sequence)) if isinstance(sequence, Mapping) else None,
            raw=dict(data),
        )

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def to_dict(self) -> Dict[str, Any]:
        """The job's JSON as the server answered it."""
        return dict(self.raw)


Seconds = Union[int, float, _dt.timedelta]


@dataclass
class NewJob:
    """A job to enqueue, for ``enqueue_many`` (plain dicts with the same keys work as well)."""

    kind: str
    payload: Any = None
    queue: Optional[str] = None
    priority: Optional[int] = None
    delay: Optional[Seconds] = None
    run_at: Optional[_dt.datetime] = None
    max_attempts: Optional[int] = None
    idempotency_key: Optional[str] = None
    tenant: Optional[str] = None
    unique: Optional[Dict[str, Any]] = None
    timeout: Optional[Seconds] = None
    tags: Optional[List[str]] = None
    ttl: Optional[Seconds] = None
    expires_at: Optional[_dt.datetime] = None
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    limits: Optional[List[str]] = None
    sequence: Optional[Union[str, Dict[str, Any]]] = None
    debounce: Optional[Dict[str, Any]] = None
    throttle: Optional[Dict[str, Any]] = None


ProgressReporter = Callable[["LeasedJob", int, Optional[str]], Awaitable[None]]


class LeasedJob:
    """The job a handler receives: what it needs to do the work, under a lease the worker
    renews. ``lease_lost`` turns true when the server says the lease no longer holds
    (cancelled, or rescued after expiring): a long sync handler may check it and give up, its
    result would be dropped anyway (an async handler is cancelled).

    A workflow's step also has ``flow_id``, ``step`` (its name; for a compensation job, the
    step it compensates) and ``parents`` (the completed parent steps' results by step name);
    for a plain job they are ``None``, ``None`` and ``{}``. ``progress(percent, message)``
    reports how far the handler has come."""

    __slots__ = (
        "id",
        "kind",
        "queue",
        "payload",
        "attempt",
        "max_attempts",
        "timeout_ms",
        "lease_token",
        "lease_expires_at",
        "tenant",
        "tags",
        "flow_id",
        "step",
        "parents",
        "expires_at",
        "traceparent",
        "tracestate",
        "handler_traceparent",
        "raw",
        "_lost",
        "_reporter",
    )

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.id: str = data["id"]
        self.kind: str = data["kind"]
        self.queue: str = data.get("queue", "")
        self.payload: Any = data.get("payload")
        self.attempt: int = data.get("attempt", 1)
        self.max_attempts: int = data.get("max_attempts", 1)
        self.timeout_ms: Optional[int] = data.get("timeout_ms")
        self.lease_token: str = data["lease_token"]
        self.lease_expires_at: Optional[str] = data.get("lease_expires_at")
        self.tenant: Optional[str] = data.get("tenant")
        self.tags: List[str] = data.get("tags") or []
        flow_id = data.get("flow_id")
        self.flow_id: Optional[str] = str(flow_id) if flow_id is not None else None
        self.step: Optional[str] = data.get("step")
        parents = data.get("parents")
        self.parents: Dict[str, Any] = dict(parents) if isinstance(parents, Mapping) else {}
        self.expires_at: Optional[str] = data.get("expires_at")
        # The producer's W3C trace context, and a child context for the handler's own span
        # (to pass on to what it calls); None without one.
        self.traceparent: Optional[str] = data.get("traceparent")
        self.tracestate: Optional[str] = data.get("tracestate")
        self.handler_traceparent: Optional[str] = _trace.child(self.traceparent)
        self.raw: Mapping[str, Any] = data
        self._lost = False
        self._reporter: Optional[ProgressReporter] = None

    @property
    def lease_lost(self) -> bool:
        return self._lost

    @property
    def trace_id(self) -> Optional[str]:
        """The trace the producer's span belongs to (32 hex digits), for logs; or ``None``."""
        parsed = _trace.parse(self.traceparent)
        return parsed[0] if parsed else None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def progress(self, percent: Union[int, float], message: Optional[str] = None) -> Awaitable[None]:
        """Reports how far the handler has come (``POST /v1/jobs/{id}/progress``, under this
        job's lease): ``percent`` from 0 to 100 (rounded to a whole number), ``message`` an
        optional note (at most 1,024 characters). Shown in the job's and its flow step's views.

        In an ``async def`` handler, ``await job.progress(50)`` (not awaiting it sends it all
        the same); in a plain function (run on a thread) ``job.progress(50)`` blocks until it
        is recorded. Raises ``LeaseLost`` when the job no longer runs here (cancelled, or
        rescued after its lease expired)."""
        if isinstance(percent, bool) or not isinstance(percent, (int, float)):
            raise TypeError("percent must be a number from 0 to 100")
        if not 0 <= percent <= 100:  # NaN fails this too
            raise ValueError("percent must be from 0 to 100")
        if message is not None and not isinstance(message, str):
            raise TypeError("message must be a string")
        if self._reporter is None:
            raise RuntimeError("progress() needs a job handed to a handler by a running Worker")
        return self._reporter(self, int(round(percent)), message)

    def parent(self, step: str, default: Any = None) -> Any:
        """A parent step's result by the parent's name (``default`` when there is none)."""
        return self.parents.get(step, default)

    def __repr__(self) -> str:
        flow = f", flow_id={self.flow_id!r}, step={self.step!r}" if self.flow_id is not None else ""
        return (
            f"LeasedJob(id={self.id!r}, kind={self.kind!r}, queue={self.queue!r}, "
            f"attempt={self.attempt}{flow})"
        )


# --- Workflows -----------------------------------------------------------------------------

# A flow in one of these states is finished (only ``running`` and ``compensating`` are not).
FLOW_FINISHED_STATES = frozenset({"completed", "failed", "compensated", "cancelled"})


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


@dataclass(frozen=True)
class CreatedFlow:
    """What ``create_flow`` answers: the flow's id, each job step's job id by step name (wait
    steps have none), and ``duplicate`` (the flow's ``idempotency_key`` matched a stored flow,
    which is answered instead)."""

    id: str
    steps: Dict[str, str] = field(default_factory=dict)
    duplicate: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CreatedFlow":
        steps = data.get("steps")
        return cls(
            id=str(data["id"]),
            steps={str(k): str(v) for k, v in steps.items()} if isinstance(steps, Mapping) else {},
            duplicate=bool(data.get("duplicate", False)),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Progress:
    """A running job's last progress report."""

    percent: int
    message: Optional[str] = None
    at: Optional[_dt.datetime] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Progress":
        return cls(
            percent=int(data.get("percent", 0)),
            message=_opt_str(data.get("message")),
            at=parse_time(data.get("at")),
        )


@dataclass(frozen=True)
class StepError:
    """Why a step failed: its job's last error."""

    error_class: str
    message: str


@dataclass(frozen=True)
class StepView:
    """One step of a flow as ``GET /v1/flows/{id}`` shows it. ``state`` is ``pending``,
    ``active``, ``waiting``, ``completed``, ``failed``, ``skipped`` or ``cancelled``; ``result``
    is the step's result (a wait step's signal payload)."""

    name: str
    state: str
    after: List[str] = field(default_factory=list)
    on_parent_failure: str = "fail"
    job_id: Optional[str] = None
    kind: Optional[str] = None
    wait: Optional[Dict[str, Any]] = None
    job_state: Optional[str] = None
    attempts: int = 0
    result: Any = None
    error: Optional[StepError] = None
    progress: Optional[Progress] = None
    wait_deadline: Optional[_dt.datetime] = None
    compensation: Optional[str] = None
    compensation_job_id: Optional[str] = None
    finished_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StepView":
        error = data.get("error")
        progress = data.get("progress")
        wait = data.get("wait")
        return cls(
            name=str(data.get("name", "")),
            state=str(data.get("state", "")),
            after=[str(a) for a in data.get("after") or []],
            on_parent_failure=str(data.get("on_parent_failure", "fail")),
            job_id=_opt_str(data.get("job_id")),
            kind=_opt_str(data.get("kind")),
            wait=dict(wait) if isinstance(wait, Mapping) else None,
            job_state=_opt_str(data.get("job_state")),
            attempts=int(data.get("attempts", 0)),
            result=data.get("result"),
            error=(
                StepError(error_class=str(error.get("class", "")), message=str(error.get("message", "")))
                if isinstance(error, Mapping)
                else None
            ),
            progress=Progress.from_json(progress) if isinstance(progress, Mapping) else None,
            wait_deadline=parse_time(data.get("wait_deadline")),
            compensation=_opt_str(data.get("compensation")),
            compensation_job_id=_opt_str(data.get("compensation_job_id")),
            finished_at=parse_time(data.get("finished_at")),
            raw=dict(data),
        )

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


@dataclass(frozen=True)
class FlowView:
    """A flow as ``GET /v1/flows/{id}`` shows it. ``state`` is ``running``, ``completed``,
    ``failed``, ``compensating``, ``compensated`` or ``cancelled``; ``steps`` are in the order
    they were given (empty in ``list_flows``); ``step_counts`` counts steps by state.
    ``flow.step("name")`` finds one step; ``flow["state"]`` reads the JSON as answered."""

    id: str
    state: str
    on_failure: str = "stop"
    name: Optional[str] = None
    failed_step: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    created_at: Optional[_dt.datetime] = None
    finished_at: Optional[_dt.datetime] = None
    steps: List[StepView] = field(default_factory=list)
    step_counts: Dict[str, int] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FlowView":
        counts = data.get("step_counts")
        return cls(
            id=str(data["id"]),
            state=str(data.get("state", "")),
            on_failure=str(data.get("on_failure", "stop")),
            name=_opt_str(data.get("name")),
            failed_step=_opt_str(data.get("failed_step")),
            tags=[str(t) for t in data.get("tags") or []],
            created_at=parse_time(data.get("created_at")),
            finished_at=parse_time(data.get("finished_at")),
            steps=[StepView.from_json(s) for s in data.get("steps") or [] if isinstance(s, Mapping)],
            step_counts=(
                {str(k): int(v) for k, v in counts.items()} if isinstance(counts, Mapping) else {}
            ),
            raw=dict(data),
        )

    @property
    def finished(self) -> bool:
        """Whether the flow has ended (any state but ``running`` and ``compensating``)."""
        return self.state in FLOW_FINISHED_STATES

    def step(self, name: str) -> StepView:
        """The step named ``name``; ``KeyError`` when there is none."""
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def to_dict(self) -> Dict[str, Any]:
        """The flow's JSON as the server answered it."""
        return dict(self.raw)


@dataclass(frozen=True)
class FlowPage:
    """A page of ``list_flows``: flows newest first (without their steps), and ``next``, the
    ``after`` of the next page (``None`` on the last)."""

    flows: List[FlowView]
    next: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FlowPage":
        return cls(
            flows=[FlowView.from_json(f) for f in data.get("flows") or [] if isinstance(f, Mapping)],
            next=_opt_str(data.get("next")),
        )


# --- Circuit breakers ----------------------------------------------------------------------


class BreakerSettings(TypedDict, total=False):
    """A circuit breaker's settings, as ``set_circuit_breaker`` sends them (every key optional,
    the server's default in brackets below) and as the server answers them (every key present).
    It opens when, over the last ``window_ms``, at least ``min_calls`` attempts finished and at
    least ``failure_ratio`` of them failed; stays open ``open_ms``; then hands out
    ``half_open_calls`` probe jobs, which must all succeed to close it."""

    # Share of failed attempts that opens it: above 0, at most 1 [0.5].
    failure_ratio: float
    # Fewest attempts in the window before it may open: 1 to 1,000,000 [10].
    min_calls: int
    # The sliding window attempts are counted over: 100 ms to a week [60,000].
    window_ms: int
    # How long it stays open before probing: 100 ms to a week [30,000].
    open_ms: int
    # Probe jobs handed out while half-open; that many successes close it: 1 to 1,000 [1].
    half_open_calls: int
    # A failure with a retry-after (a dependency's 429) opens it until then; meant for a kind's
    # breaker [False].
    pause_on_retry_after: bool


class _BreakerViewFields(TypedDict):
    scope: str
    name: str
    state: str
    calls: int
    failures: int
    opened_at: Optional[str]
    open_until: Optional[str]
    probes_started: int
    probe_successes: int
    reason: Optional[str]
    manual: bool
    changed_at: Optional[str]


class BreakerView(_BreakerViewFields, total=False):
    """A queue's or a kind's circuit breaker and its state, as the server answers it (a plain
    dict): ``scope`` (``"queue"`` or ``"kind"``), ``name``, ``state`` (``"closed"``, ``"open"``
    or ``"half_open"``), ``settings`` (absent when none are configured: it may still be open
    by hand), ``calls``/``failures`` in the current window, ``opened_at``, ``open_until``
    (``None`` while open until closed by hand), ``probes_started``, ``probe_successes``,
    ``reason``, ``manual`` (opened by an operator or a retry-after) and ``changed_at``; times
    are RFC 3339 strings (``parse_time`` reads them)."""

    settings: BreakerSettings


# --- Batches -------------------------------------------------------------------------------


class _BatchSettingsFields(TypedDict):
    max_size: int
    max_wait_ms: int


class BatchSettings(_BatchSettingsFields, total=False):
    """A kind's batch setting as the server answers it (a plain dict): its jobs go out only to
    batch fetches (``@worker.batch_handler``), up to ``max_size`` (1 to 1,000) at once, all of
    one queue (and, with ``key``, one key value: ``"tenant"``, ``"kind"``, ``"queue"`` or
    ``"payload.a.b"``); a smaller batch goes out once its oldest job has waited
    ``max_wait_ms`` (0, the default, to an hour)."""

    key: str


# --- Named limits --------------------------------------------------------------------------


class LimitRate(TypedDict):
    """At most ``count`` jobs of one key start within any ``period_ms`` (up to a day)."""

    count: int
    period_ms: int


class _LimitFields(TypedDict):
    name: str
    updated_at: str


class Limit(_LimitFields, total=False):
    """A named limit as the server answers it (a plain dict; fields it does not set are
    absent): ``name``, ``concurrency`` (at most this many jobs of one key running at once),
    ``rate`` (:class:`LimitRate`), ``key`` (where a job's key is taken from: ``"tenant"``,
    ``"kind"``, ``"queue"`` or ``"payload.a.b"``; without it every job shares one budget),
    ``weights`` (starts per round-robin turn by key value) and ``updated_at`` (RFC 3339)."""

    concurrency: int
    rate: LimitRate
    key: str
    weights: Dict[str, int]


class KeyUsage(TypedDict):
    """What one key of a limit uses now: ``key`` (``""`` for a limit without ``key``), its
    ``running`` jobs and its ``recent_starts`` within the rate's period (0 without a rate)."""

    key: str
    running: int
    recent_starts: int


class LimitView(Limit, total=False):
    """A named limit with what its keys use now (``get_limit``): :class:`Limit`'s fields,
    ``in_use`` (running jobs under it, over all its keys) and ``usage`` (:class:`KeyUsage` of
    each key with running jobs or recent starts)."""

    in_use: int
    usage: List[KeyUsage]


class _BlockedByFields(TypedDict):
    limit: str
    key: str
    running: int
    recent_starts: int


class BlockedBy(_BlockedByFields, total=False):
    """One limit key with no room left that holds an available job back (a job's
    ``blocked_by``): the ``limit``'s name, the ``key`` value (``""`` for a limit without
    ``key``), its ``running`` jobs and ``recent_starts``, and the limit's ``concurrency`` and
    ``rate`` when it sets them."""

    concurrency: int
    rate: LimitRate


# --- Sequences -----------------------------------------------------------------------------


class JobSequence(TypedDict):
    """A job's place in its sequence (a job's ``sequence``), stamped at enqueue: ``key``, the
    sequence (the key expression and the job's value there, ``"payload.account=acme"``), ``no``,
    its number in it (1 for the first job of the key, each later one more than the last still
    stored: the order they run in), and ``on_dead`` (``"block"``: a dead job holds back the
    ones behind it until it is replayed, discarded or cancelled; ``"skip"``: it does not)."""

    key: str
    no: int
    on_dead: str


class _SequenceBlockedByFields(TypedDict):
    sequence: str
    no: int


class SequenceBlockedBy(_SequenceBlockedByFields, total=False):
    """What a ``blocked`` job waits for (a job's ``blocked_by``): its ``sequence`` (the key,
    ``"payload.account=acme"``) and its own number ``no`` in it, and the job in front that
    holds the sequence: its id (``job``), ``state`` and number (``holder_no``), absent when
    none is found (the blocked job is being released)."""

    job: str
    state: str
    holder_no: int
