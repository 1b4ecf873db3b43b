"""Fixtures: a real `conveyor serve` per test module (or per test, when a test restarts it or
needs options); see support.py."""

from __future__ import annotations

import uuid
from typing import Callable, Iterator, List, Optional

import pytest

from support import Server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server().start()
    yield srv
    srv.close()


@pytest.fixture()
def own_server() -> Iterator[Callable[..., Server]]:
    """A server of the test's own (to restart it, or with options)."""
    servers: List[Server] = []

    def make(extra: Optional[List[str]] = None, *, start: bool = True) -> Server:
        srv = Server(extra)
        servers.append(srv)
        return srv.start() if start else srv

    yield make
    for srv in servers:
        srv.close()


@pytest.fixture()
def queue() -> str:
    """A queue of the test's own, so tests sharing a server never see each other's jobs."""
    return f"q-{uuid.uuid4().hex[:12]}"
