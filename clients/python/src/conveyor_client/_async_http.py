"""A small keep-alive HTTP/1.1 transport on asyncio streams (the standard library has no
asyncio HTTP client; this speaks just what Conveyor's JSON API needs: requests with a
Content-Length body, answers with Content-Length, chunked, or until close)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Any, Dict, List, Optional, Tuple

from . import _wire
from ._sync_http import IDLE_LIMIT
from .errors import TransportError

_MAX_HEADER_BYTES = 64 * 1024


class _StaleConnection(Exception):
    """A reused connection the server had closed before our request reached it."""


class _Connection:
    __slots__ = ("reader", "writer", "since", "expired")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.since = time.monotonic()
        self.expired = False

    def expire(self) -> None:
        """The request's time is up: cut the connection, so the pending read fails."""
        self.expired = True
        try:
            self.writer.transport.abort()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken socket may complain; nothing to do
            pass


async def _read_response(conn: _Connection, method: str) -> Tuple[int, Dict[str, str], bytes, bool]:
    reader = conn.reader
    line = await reader.readline()
    if not line:
        raise _StaleConnection()
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise TransportError(f"malformed status line {line[:100]!r}")
    status = int(parts[1])
    version_11 = parts[0] == "HTTP/1.1"
    headers: Dict[str, str] = {}
    size = 0
    while True:
        line = await reader.readline()
        if not line:
            raise TransportError("connection closed in the answer's headers")
        size += len(line)
        if size > _MAX_HEADER_BYTES:
            raise TransportError("the answer's headers are too large")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = ("close" not in connection) if version_11 else ("keep-alive" in connection)
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, headers, b"", keep_alive
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: List[bytes] = []
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise TransportError("connection closed in a chunked answer")
            chunk_size = int(size_line.split(b";", 1)[0].strip(), 16)
            if chunk_size == 0:
                # Trailers, then the blank line.
                while True:
                    trailer = await reader.readline()
                    if trailer in (b"\r\n", b"\n", b""):
                        break
                break
            chunks.append(await reader.readexactly(chunk_size))
            await reader.readexactly(2)
        return status, headers, b"".join(chunks), keep_alive
    length = headers.get("content-length")
    if length is not None:
        body = await reader.readexactly(int(length)) if int(length) else b""
        return status, headers, body, keep_alive
    return status, headers, await reader.read(), False


class AsyncTransport:
    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 60.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        max_idle: int = 16,
    ) -> None:
        self.endpoint = _wire.Endpoint(url)
        self.token = token or None
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.max_idle = max_idle
        self._idle: List[_Connection] = []
        self._closed = False

    async def _connect(self) -> _Connection:
        ep = self.endpoint
        context: Optional[ssl.SSLContext] = None
        if ep.tls:
            context = self.ssl_context or ssl.create_default_context()
        reader, writer = await asyncio.open_connection(ep.host, ep.port, ssl=context, limit=2**20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        return _Connection(reader, writer)

    def _take(self) -> Optional[_Connection]:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.since < IDLE_LIMIT and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.since = time.monotonic()
        self._idle.append(conn)

    async def request(
        self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None
    ) -> Any:
        data = _wire.encode(body) if body is not None else (b"" if method == "POST" else None)
        status, headers, payload = await self.raw(method, path, data, timeout=timeout)
        return _wire.decode(status, payload, headers)

    async def request_bytes(
        self, method: str, path: str, data: bytes, *, timeout: Optional[float] = None
    ) -> Any:
        """Like ``request`` with a body already encoded."""
        status, headers, payload = await self.raw(method, path, data, timeout=timeout)
        return _wire.decode(status, payload, headers)

    async def raw(
        self, method: str, path: str, data: Optional[bytes], *, timeout: Optional[float] = None
    ) -> Tuple[int, Dict[str, str], bytes]:
        if self._closed:
            raise TransportError("the client is closed")
        timeout = self.timeout if timeout is None else timeout
        head = _wire.headers(self.endpoint, self.token, data)
        lines = [f"{method} {self.endpoint.prefix + path} HTTP/1.1"]
        lines.extend(f"{k}: {v}" for k, v in head.items())
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if data:
            request += data
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = self._take() if attempt == 0 else None
            reused = conn is not None
            timer: Optional[asyncio.TimerHandle] = None
            try:
                if conn is None:
                    conn = await asyncio.wait_for(self._connect(), timeout)
                # A timer rather than asyncio.wait_for, which costs a task per request and, before
                # Python 3.12, may swallow a cancellation that meets the answer.
                timer = loop.call_later(timeout, conn.expire)
                conn.writer.write(request)
                await conn.writer.drain()
                status, headers, payload, keep = await _read_response(conn, method)
            except (_StaleConnection, ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
                if conn is not None:
                    conn.close()
                if conn is not None and conn.expired:
                    raise TransportError(f"{method} {path}: no answer within {timeout:g} s") from None
                if reused:
                    continue
                raise TransportError(f"{method} {path}: connection lost: {type(exc).__name__}") from None
            except asyncio.TimeoutError:
                if conn is not None:
                    conn.close()
                raise TransportError(f"{method} {path}: no connection within {timeout:g} s") from None
            except asyncio.IncompleteReadError as exc:
                if conn is not None:
                    conn.close()
                if conn is not None and conn.expired:
                    raise TransportError(f"{method} {path}: no answer within {timeout:g} s") from None
                raise TransportError(f"{method} {path}: connection closed mid-answer") from exc
            except (OSError, ValueError) as exc:
                if conn is not None:
                    conn.close()
                if conn is not None and conn.expired:
                    raise TransportError(f"{method} {path}: no answer within {timeout:g} s") from None
                raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            except BaseException:
                # Cancelled (or worse) mid-request: the connection is in an unknown state.
                if conn is not None:
                    conn.close()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if keep:
                self._give_back(conn)
            else:
                conn.close()
            return status, headers, payload
        raise TransportError(f"{method} {path}: connection lost")  # pragma: no cover

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            try:
                await asyncio.wait_for(conn.writer.wait_closed(), 1.0)
            except Exception:  # noqa: BLE001
                pass
