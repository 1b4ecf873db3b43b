"""Typed views of the server's JSON: jobs as read back, jobs to enqueue, and the job a handler
receives."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

__all__ = ["Job", "ErrorRecord", "Lease", "NewJob", "LeasedJob", "parse_time", "format_time"]

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ErrorRecord":
        return cls(
            attempt=int(data.get("attempt", 0)),
            at=parse_time(data.get("at")),
            error_class=str(data.get("class", "")),
            message=str(data.get("message", "")),
        )


@dataclass(frozen=True)
class Lease:
    """Who holds a running job and until when."""

    worker_id: str
    expires_at: Optional[_dt.datetime]


@dataclass(frozen=True)
class Job:
    """A job as ``GET /v1/jobs/{id}`` shows it. ``raw`` is the JSON as answered (fields a newer
    server adds are there too); ``job["state"]`` reads it as well."""

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
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Job":
        lease = data.get("lease")
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


class LeasedJob:
    """The job a handler receives: what it needs to do the work, under a lease the worker
    renews. ``lease_lost`` turns true when the server says the lease no longer holds
    (cancelled, or rescued after expiring): a long sync handler may check it and give up, its
    result would be dropped anyway (an async handler is cancelled)."""

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
        "raw",
        "_lost",
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
        self.raw: Mapping[str, Any] = data
        self._lost = False

    @property
    def lease_lost(self) -> bool:
        return self._lost

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def __repr__(self) -> str:
        return f"LeasedJob(id={self.id!r}, kind={self.kind!r}, queue={self.queue!r}, attempt={self.attempt})"
