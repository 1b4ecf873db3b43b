"""What the sync and async clients share: URLs, headers, JSON bodies, answers."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union, cast
from urllib.parse import quote, urlsplit

from . import _trace
from ._version import __version__
from .errors import ConveyorError, TransportError, error_from_response
from .models import FLOW_FINISHED_STATES, BatchSettings, BreakerSettings, format_time

USER_AGENT = f"conveyor-client-python/{__version__}"

Seconds = Union[int, float, _dt.timedelta]


def dumps(value: Any) -> str:
    """Compact JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode(value: Any) -> bytes:
    return dumps(value).encode("utf-8")


class Endpoint:
    """Where the server is: scheme, host, port and a path prefix, from its base URL."""

    def __init__(self, url: str) -> None:
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} (http or https)")
        if not parts.hostname:
            raise ValueError(f"no host in URL {url!r}")
        self.url = url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"


def headers(endpoint: Endpoint, token: Optional[str], body: Optional[bytes]) -> Dict[str, str]:
    result = {
        "Host": endpoint.host_header,
        "User-Agent": USER_AGENT,
        "Accept": "application/json",
    }
    if token:
        result["Authorization"] = f"Bearer {token}"
    if body is not None:
        result["Content-Type"] = "application/json"
        result["Content-Length"] = str(len(body))
    return result


# A job in one of these states never runs again unless replayed.
FINISHED_STATES = frozenset({"completed", "dead", "cancelled"})

# The longest one long-poll asks the server for (it caps it at its --max-fetch-wait-ms).
MAX_WAIT_MS = 30_000


def wait_deadline_ms(timeout: Seconds) -> int:
    """``timeout`` in milliseconds, checked (non-negative)."""
    return _milliseconds(timeout, "timeout")


def job_path(job_id: str, action: str = "") -> str:
    path = "/v1/jobs/" + quote(str(job_id), safe="")
    return path + "/" + action if action else path


def kind_path(kind: str) -> str:
    return "/v1/kinds/" + quote(str(kind), safe="")


def kind_body(schema: Any, version: Optional[int], force: bool) -> Dict[str, Any]:
    body: Dict[str, Any] = {"schema": schema}
    if version is not None:
        body["version"] = version
    if force:
        body["force"] = True
    return body


def breaker_scope(queue: Optional[str], kind: Optional[str]) -> Tuple[str, str]:
    """``("queue", name)`` or ``("kind", name)``: exactly one of ``queue`` and ``kind``."""
    if (queue is None) == (kind is None):
        raise ValueError("give queue= or kind= (exactly one): whose circuit breaker")
    scope, name = ("queue", queue) if queue is not None else ("kind", kind)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{scope} must be a non-empty string")
    return scope, name


def scope_path(scope: str, name: str, action: str = "") -> str:
    """``/v1/queues/{name}`` or ``/v1/kinds/{kind}``, with ``/circuit/{action}`` if given."""
    base = "/v1/queues/" if scope == "queue" else "/v1/kinds/"
    path = base + quote(name, safe="")
    return path + "/circuit/" + action if action else path


def breaker_settings(settings: Any) -> Optional[Dict[str, Any]]:
    """``settings`` as sent: a mapping (every key optional; the server checks the values and
    names the one at fault, ``circuit_breaker.failure_ratio``), or ``None`` to remove it."""
    if settings is None:
        return None
    if not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of breaker settings or None, got {type(settings).__name__}")
    return dict(settings)


def circuit_body(open_ms: Optional[int] = None, reason: Optional[str] = None) -> Dict[str, Any]:
    """The body of ``POST .../circuit/open`` (``open_ms``, ``reason``) or ``.../close``."""
    body: Dict[str, Any] = {}
    if open_ms is not None:
        if isinstance(open_ms, bool) or not isinstance(open_ms, int):
            raise TypeError("open_ms must be a whole number of milliseconds (or None: until closed)")
        body["open_ms"] = open_ms
    if reason is not None:
        if not isinstance(reason, str):
            raise TypeError("reason must be a string")
        body["reason"] = reason
    return body


def kept_version(existing: Any) -> Dict[str, Any]:
    """A kind's stored schema ``version``, to send back with a breaker-only ``PUT``: the server
    keeps a schema left out of the request but resets a version left out."""
    if isinstance(existing, dict) and existing.get("version") is not None:
        return {"version": existing["version"]}
    return {}


def stored_breaker(answer: Any) -> Optional[BreakerSettings]:
    """The ``circuit_breaker`` of a queue's or a kind's settings as answered (``None``: none)."""
    if not isinstance(answer, dict):
        raise TransportError("the server's settings answer is not an object")
    value = answer.get("circuit_breaker")
    return cast(BreakerSettings, value) if isinstance(value, dict) else None


def limit_names(limits: Iterable[str]) -> List[str]:
    """A job's ``limits`` as sent: a list of names (a lone string is refused, not split into
    letters). Whether each names a defined limit is the server's to say (``limits[i]``)."""
    if isinstance(limits, (str, bytes)) or not isinstance(limits, Iterable):
        raise TypeError("limits must be a list of limit names")
    return list(limits)


def sequence_spec(sequence: Union[str, Mapping[str, Any]]) -> Union[str, Dict[str, Any]]:
    """A job's ``sequence`` as sent: a key expression (``"tenant"``, ``"kind"``, ``"queue"`` or
    ``"payload.a.b"``) or a dict ``{"key": ..., "on_dead": "block"|"skip"}``. Whether the
    expression is valid is the server's to say (``sequence``)."""
    if isinstance(sequence, str):
        return sequence
    if not isinstance(sequence, Mapping):
        raise TypeError(
            'sequence must be a key expression ("payload.account") or a dict '
            '{"key": ..., "on_dead": "block"|"skip"}'
        )
    return dict(sequence)


def debounce_spec(debounce: Mapping[str, Any]) -> Dict[str, Any]:
    """A job's ``debounce`` as sent: a dict ``{"key": ..., "delay": seconds, "max_wait":
    seconds, "mode": "trailing"|"leading"}``, durations as seconds (or timedeltas) or in the
    server's names, ``delay_ms`` and ``max_wait_ms``. Everything else (a bad key expression, a
    duration of 0, a field it does not know) is the server's to say (``debounce.key``,
    ``debounce.delay_ms``, ...)."""
    if not isinstance(debounce, Mapping):
        raise TypeError(
            'debounce must be a dict {"key": ..., "delay": seconds, "max_wait": seconds, '
            '"mode": "trailing"|"leading"}'
        )
    body = dict(debounce)
    _duration_field(body, "delay", "debounce")
    _duration_field(body, "max_wait", "debounce")
    return body


def throttle_spec(throttle: Mapping[str, Any]) -> Dict[str, Any]:
    """A job's ``throttle`` as sent: a dict ``{"key": ..., "period": seconds}`` (or
    ``period_ms``, the server's name). The server checks the values (``throttle.key``,
    ``throttle.period_ms``)."""
    if not isinstance(throttle, Mapping):
        raise TypeError('throttle must be a dict {"key": ..., "period": seconds}')
    body = dict(throttle)
    _duration_field(body, "period", "throttle")
    return body


def batch_spec(
    batch: Optional[Mapping[str, Any]] = None,
    *,
    max_size: Optional[int] = None,
    max_wait: Optional[Seconds] = None,
    max_wait_ms: Optional[int] = None,
    key: Optional[str] = None,
) -> Dict[str, Any]:
    """A kind's ``batch`` setting as sent (``PUT /v1/kinds/{kind}``): a dict ``{"max_size": N,
    "max_wait": seconds, "key": ...}`` (``max_wait`` as seconds or a timedelta, or
    ``max_wait_ms``, the server's name) or the same as keywords, not both. Everything else (a
    size out of range, a bad key expression, a field it does not know) is the server's to say
    (``batch.max_size``, ``batch.max_wait_ms``, ``batch.key``)."""
    given = {
        name: value
        for name, value in (
            ("max_size", max_size),
            ("max_wait", max_wait),
            ("max_wait_ms", max_wait_ms),
            ("key", key),
        )
        if value is not None
    }
    if batch is not None:
        if not isinstance(batch, Mapping):
            raise TypeError(
                'batch must be a dict {"max_size": N, "max_wait": seconds, "key": ...}, '
                f"got {type(batch).__name__}"
            )
        if given:
            raise ValueError("give the batch setting as a dict or as keywords, not both")
        body = dict(batch)
    elif given:
        body = given
    else:
        raise ValueError("give the batch setting: max_size= (and max_wait=, key=), or a dict")
    _duration_field(body, "max_wait", "batch")
    return body


def stored_batch(answer: Any) -> Optional[BatchSettings]:
    """The ``batch`` of a kind's settings as answered (``None``: the kind is no batch kind)."""
    if not isinstance(answer, dict):
        raise TransportError("the server's settings answer is not an object")
    value = answer.get("batch")
    return cast(BatchSettings, value) if isinstance(value, dict) else None


def _duration_field(body: Dict[str, Any], name: str, where: str) -> None:
    """``body[name]`` (seconds or a timedelta) as ``body[name + "_ms"]``; left out if ``None``."""
    if name not in body:
        return
    value = body.pop(name)
    wire = name + "_ms"
    if wire in body:
        raise ValueError(f"{where}: give {name} or {wire}, not both")
    if value is not None:
        body[wire] = _milliseconds(value, f"{where}.{name}")


def limit_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError("a limit's name must be a non-empty string")
    return "/v1/limits/" + quote(name, safe="")


def limit_body(
    concurrency: Optional[int],
    rate: Optional[Mapping[str, Any]],
    key: Optional[str],
    weights: Optional[Mapping[str, int]],
) -> Dict[str, Any]:
    """The body of ``PUT /v1/limits/{name}``: the fields given (the server checks the values
    and names the one at fault, ``rate.period_ms``)."""
    body: Dict[str, Any] = {}
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise TypeError("concurrency must be a whole number of jobs")
        body["concurrency"] = concurrency
    if rate is not None:
        if not isinstance(rate, Mapping):
            raise TypeError('rate must be a dict {"count": N, "period_ms": MS}')
        body["rate"] = dict(rate)
    if key is not None:
        if not isinstance(key, str):
            raise TypeError('key must be a string: "tenant", "kind", "queue" or "payload.a.b"')
        body["key"] = key
    if weights is not None:
        if not isinstance(weights, Mapping):
            raise TypeError("weights must be a dict of key value to weight")
        body["weights"] = dict(weights)
    return body


def flow_path(flow_id: str, action: str = "") -> str:
    path = "/v1/flows/" + quote(str(flow_id), safe="")
    return path + "/" + action if action else path


def milliseconds(value: Seconds, name: str) -> int:
    """Seconds (a number or a timedelta) in whole milliseconds, checked (non-negative)."""
    return _milliseconds(value, name)


def query(params: Mapping[str, Any]) -> str:
    """``?a=1&b=x`` from the parameters that are not ``None`` (or ``""`` when none are)."""
    pairs = [
        f"{quote(key, safe='')}={quote(str(value), safe='')}"
        for key, value in params.items()
        if value is not None
    ]
    return "?" + "&".join(pairs) if pairs else ""


def decode(status: int, body: bytes, response_headers: Mapping[str, str]) -> Any:
    """The JSON of a 2xx answer, or the matching ``ConveyorError``."""
    if 200 <= status < 300:
        if not body:
            return None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise TransportError(f"the server answered {status} with malformed JSON: {exc}") from None
    raise error_from_response(status, body, dict(response_headers))


def _milliseconds(value: Seconds, name: str) -> int:
    seconds = value.total_seconds() if isinstance(value, _dt.timedelta) else float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds")
    return int(round(seconds * 1000))


# Python keyword → how it goes on the wire (None: as it is).
_ENQUEUE_KEYS = (
    "kind",
    "payload",
    "queue",
    "priority",
    "delay",
    "run_at",
    "max_attempts",
    "idempotency_key",
    "tenant",
    "unique",
    "timeout",
    "tags",
    "ttl",
    "expires_at",
    "traceparent",
    "tracestate",
    "limits",
    "sequence",
    "debounce",
    "throttle",
)


def enqueue_body(
    kind: str,
    payload: Any = None,
    *,
    queue: Optional[str] = "default",
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
    extra: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The JSON object of one job for ``POST /v1/jobs`` (or an element of a batch). Without a
    ``traceparent``, the active OpenTelemetry span's context goes with the job (when
    OpenTelemetry is installed)."""
    if not isinstance(kind, str):
        raise TypeError("kind must be a string")
    body: Dict[str, Any] = {"kind": kind}
    if payload is not None:
        body["payload"] = payload
    if queue is not None:
        body["queue"] = queue
    if priority is not None:
        body["priority"] = priority
    if delay is not None and run_at is not None:
        raise ValueError("give delay or run_at, not both")
    if delay is not None:
        body["delay_ms"] = _milliseconds(delay, "delay")
    if run_at is not None:
        if isinstance(run_at, str):
            body["run_at"] = run_at
        else:
            body["run_at"] = format_time(run_at)
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if tenant is not None:
        body["tenant"] = tenant
    if unique is not None:
        body["unique"] = dict(unique)
    if timeout is not None:
        body["timeout_ms"] = max(1, _milliseconds(timeout, "timeout"))
    if tags is not None:
        body["tags"] = list(tags)
    if limits is not None:
        body["limits"] = limit_names(limits)
    if sequence is not None:
        body["sequence"] = sequence_spec(sequence)
    if debounce is not None:
        body["debounce"] = debounce_spec(debounce)
    if throttle is not None:
        body["throttle"] = throttle_spec(throttle)
    if ttl is not None and expires_at is not None:
        raise ValueError("give ttl or expires_at, not both")
    if ttl is not None:
        body["ttl_ms"] = max(1, _milliseconds(ttl, "ttl"))
    if expires_at is not None:
        body["expires_at"] = expires_at if isinstance(expires_at, str) else format_time(expires_at)
    if traceparent is not None:
        body["traceparent"] = traceparent
        if tracestate is not None:
            body["tracestate"] = tracestate
    elif not (extra and "traceparent" in extra):
        body.update(_trace.current())
    if extra:
        # Wire names (delay_ms, timeout_ms, ...) and fields of newer servers go as they are;
        # the server names any it does not know in a 400.
        body.update(extra)
    return body


def job_spec_body(spec: Any, index: int, where: Optional[str] = None) -> Dict[str, Any]:
    """One element of ``enqueue_many`` (or a flow step's job, ``where`` naming it in errors): a
    dict with ``enqueue``'s keyword names (wire names such as ``delay_ms`` pass through), a
    ``NewJob``, or any object with such attributes."""
    label = where or f"jobs[{index}]"
    if isinstance(spec, Mapping):
        data = dict(spec)
    elif dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    elif hasattr(spec, "kind"):
        data = {key: getattr(spec, key) for key in _ENQUEUE_KEYS if hasattr(spec, key)}
    else:
        raise TypeError(f"{label}: expected a dict or an object with a 'kind', got {type(spec).__name__}")
    if "kind" not in data:
        raise ValueError(f"{label}: missing 'kind'")
    known = {key: data.pop(key) for key in _ENQUEUE_KEYS if key in data}
    known.setdefault("queue", "default")
    kind = known.pop("kind")
    payload = known.pop("payload", None)
    return enqueue_body(kind, payload, extra=data, **known)


def batch_ids(answer: Any) -> List[str]:
    if not isinstance(answer, dict) or not isinstance(answer.get("ids"), list):
        raise TransportError("the server's batch answer has no ids")
    return [str(i) for i in answer["ids"]]


def enqueued_id(answer: Any) -> str:
    if not isinstance(answer, dict) or "id" not in answer:
        raise TransportError("the server's enqueue answer has no id")
    return str(answer["id"])


def signal_body(signal: str, payload: Any) -> Dict[str, Any]:
    if not isinstance(signal, str):
        raise TypeError("signal must be a string")
    body: Dict[str, Any] = {"signal": signal}
    if payload is not None:
        body["payload"] = payload
    return body


def signal_outcome(answer: Any) -> str:
    if not isinstance(answer, dict) or "outcome" not in answer:
        raise TransportError("the server's signal answer has no outcome")
    return str(answer["outcome"])


RequestParts = Tuple[str, str, Optional[bytes]]

__all__ = [
    "ConveyorError",
    "Endpoint",
    "FLOW_FINISHED_STATES",
    "USER_AGENT",
    "batch_ids",
    "batch_spec",
    "breaker_scope",
    "breaker_settings",
    "circuit_body",
    "debounce_spec",
    "decode",
    "dumps",
    "encode",
    "enqueue_body",
    "enqueued_id",
    "flow_path",
    "headers",
    "job_path",
    "job_spec_body",
    "kept_version",
    "limit_body",
    "limit_names",
    "limit_path",
    "milliseconds",
    "query",
    "scope_path",
    "sequence_spec",
    "signal_body",
    "signal_outcome",
    "stored_batch",
    "stored_breaker",
    "throttle_spec",
]


def stats_path(
    from_: Optional[Union[str, _dt.datetime]],
    to: Optional[Union[str, _dt.datetime]],
    step: Optional[Union[str, int, _dt.timedelta]],
    queue: Optional[str],
    kind: Optional[str],
) -> str:
    """``/v1/stats?...`` from the arguments of ``stats()``: times as aware datetimes or RFC 3339
    strings, ``step`` as seconds, a ``timedelta`` or the server's text (``"5m"``)."""
    from urllib.parse import urlencode

    def when(value: Union[str, _dt.datetime]) -> str:
        return format_time(value) if isinstance(value, _dt.datetime) else str(value)

    query: List[Tuple[str, str]] = []
    if from_ is not None:
        query.append(("from", when(from_)))
    if to is not None:
        query.append(("to", when(to)))
    if step is not None:
        if isinstance(step, _dt.timedelta):
            step = int(step.total_seconds())
        query.append(("step", str(step)))
    if queue is not None:
        query.append(("queue", queue))
    if kind is not None:
        query.append(("kind", kind))
    return "/v1/stats" + ("?" + urlencode(query) if query else "")
