"""A small thread-safe keep-alive HTTP/1.1 transport on ``http.client``."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from . import _wire
from .errors import TransportError

# The server closes connections idle for 60 s (`serve --idle-timeout-secs`); drop ours first.
IDLE_LIMIT = 50.0
# Errors that, on a reused connection and before any answer, mean the server had closed it.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class SyncTransport:
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
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        ep = self.endpoint
        conn: http.client.HTTPConnection
        if ep.tls:
            context = self.ssl_context or ssl.create_default_context()
            conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)
        conn.connect()
        if conn.sock is not None:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self) -> Optional[http.client.HTTPConnection]:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                conn, since = self._idle.pop()
                if now - since < IDLE_LIMIT:
                    return conn
                conn.close()
        return None

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def request(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        """Sends one request; the answer's JSON, or raises a ``ConveyorError``."""
        data = _wire.encode(body) if body is not None else (b"" if method == "POST" else None)
        status, headers, payload = self.raw(method, path, data, timeout=timeout)
        return _wire.decode(status, payload, headers)

    def raw(
        self, method: str, path: str, data: Optional[bytes], *, timeout: Optional[float] = None
    ) -> Tuple[int, Dict[str, str], bytes]:
        if self._closed:
            raise TransportError("the client is closed")
        timeout = self.timeout if timeout is None else timeout
        full_path = self.endpoint.prefix + path
        head = _wire.headers(self.endpoint, self.token, data)
        for attempt in (0, 1):
            conn = self._take() if attempt == 0 else None
            reused = conn is not None
            try:
                if conn is None:
                    conn = self._connect(timeout)
                elif conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, full_path, body=data, headers=head)
                response = conn.getresponse()
                payload = response.read()
            except _STALE as exc:
                if conn is not None:
                    conn.close()
                if reused:
                    continue  # the server closed it while idle: once more on a fresh one
                raise TransportError(f"{method} {path}: connection lost: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            response_headers = {k.lower(): v for k, v in response.getheaders()}
            if response.will_close:
                conn.close()
            else:
                self._give_back(conn)
            return response.status, response_headers, payload
        raise TransportError(f"{method} {path}: connection lost")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()
