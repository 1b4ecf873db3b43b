"""Errors raised by the client, and the exceptions handlers raise to steer retries."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, Optional, Type, Union

__all__ = [
    "ConveyorError",
    "TransportError",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "LeaseLost",
    "PayloadTooLarge",
    "QueueFull",
    "ServerError",
    "Unavailable",
    "Retry",
    "RetryAfter",
    "Permanent",
    "error_from_response",
]


class ConveyorError(Exception):
    """An error answered by the server (or met on the way to it).

    ``status`` is the HTTP status (``None`` when no answer came), ``code`` the server's error
    code (``invalid_request``, ``not_found``, ...), ``field`` the input at fault (e.g.
    ``jobs[3].kind``) or ``None``, ``message`` the server's explanation.
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.field = field
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(f"({self.code})" if parts else self.code)
        head = " ".join(parts)
        text = f"{head}: {self.message}" if head else self.message
        if self.field:
            text += f" [field: {self.field}]"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"field={self.field!r}, message={self.message!r})"
        )


class TransportError(ConveyorError):
    """No answer from the server: connection refused or reset, timeout, malformed response."""


class InvalidRequest(ConveyorError):
    """400: the request was malformed or a value out of range; ``field`` names it."""


class Unauthorized(ConveyorError):
    """401: the token is missing, unknown, revoked or expired."""


class Forbidden(ConveyorError):
    """403: the token's role may not make this call."""


class NotFound(ConveyorError):
    """404: no such job (or route)."""


class Conflict(ConveyorError):
    """409: the job is in a state where the change does not apply (e.g. already finished)."""


class LeaseLost(Conflict):
    """409 ``lease_lost``: the lease no longer holds (rescued, cancelled or finished)."""


class PayloadTooLarge(ConveyorError):
    """413: a payload, result or the whole body exceeds the server's limit."""


class QueueFull(ConveyorError):
    """429: back-pressure (``queue_full``) or a spent enqueue rate (``rate_limited``).

    ``retry_after`` is the server's ``Retry-After`` in seconds (``None`` if absent).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        field: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message, status=status, code=code, field=field)
        self.retry_after = retry_after


class ServerError(ConveyorError):
    """5xx: a failure on the server's side; transient ones are worth retrying."""


class Unavailable(ServerError):
    """503 ``store_unavailable``: the store failed; retry later."""


_BY_STATUS: Dict[int, Type[ConveyorError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: QueueFull,
    503: Unavailable,
}


def _parse_retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(value)
        now = _dt.datetime.now(_dt.timezone.utc)
        return max(0.0, (when - now).total_seconds())
    except (TypeError, ValueError):
        return None


def error_from_response(status: int, body: bytes, headers: Optional[Dict[str, str]] = None) -> ConveyorError:
    """The exception for a non-2xx answer: ``{"error": {"code", "field", "message"}}``."""
    import json

    code: Optional[str] = None
    field: Optional[str] = None
    message = ""
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed["error"]
        code = error.get("code") if isinstance(error.get("code"), str) else None
        field = error.get("field") if isinstance(error.get("field"), str) else None
        message = error.get("message") if isinstance(error.get("message"), str) else ""
    if not message:
        text = body[:500].decode("utf-8", "replace").strip() if body else ""
        message = text or f"HTTP {status}"
    if status == 409 and code == "lease_lost":
        cls: Type[ConveyorError] = LeaseLost
    elif status in _BY_STATUS:
        cls = _BY_STATUS[status]
    elif status >= 500:
        cls = ServerError
    else:
        cls = ConveyorError
    if cls is QueueFull:
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        return QueueFull(
            message,
            status=status,
            code=code,
            field=field,
            retry_after=_parse_retry_after(lowered.get("retry-after")),
        )
    return cls(message, status=status, code=code, field=field)


# --- What handlers raise -------------------------------------------------------------------


Seconds = Union[int, float, _dt.timedelta]


def _seconds(value: Seconds) -> float:
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    return float(value)


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry with the server's backoff.

    The job goes to the dead-letter queue once its attempts are exhausted. ``error_class``
    (default ``error``) is recorded in the job's history with ``message``.
    """

    def __init__(self, message: str = "retry", *, error_class: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.error_class = error_class


class RetryAfter(Exception):
    """Raise from a handler to retry this job after ``seconds`` (float or timedelta)."""

    def __init__(
        self, seconds: Seconds, message: str = "retry later", *, error_class: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.seconds = max(0.0, _seconds(seconds))
        self.message = message
        self.error_class = error_class


class Permanent(Exception):
    """Raise from a handler to send the job straight to the dead-letter queue."""

    def __init__(self, message: str = "permanent failure", *, error_class: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.error_class = error_class
