"""Helpers for the tests: a real `conveyor serve` and polling with a deadline.

The binary is `$CONVEYOR_BIN`, else `target/debug/conveyor` at the repository root (built by
the test script, not here). Every server runs on a fresh SQLite file in a temporary directory,
on a free port; it is killed (by its pid) and its directory removed when the fixture ends.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "src"))

from conveyor_client import Worker  # noqa: E402 - after the path is set

T = TypeVar("T")


def conveyor_bin() -> str:
    path = os.environ.get("CONVEYOR_BIN") or str(REPO / "target" / "debug" / "conveyor")
    if not Path(path).exists():
        pytest.fail(f"conveyor binary {path} not found: run `cargo build -p conveyor` or set CONVEYOR_BIN")
    return path


def free_low_port() -> int:
    """A port from 20000 to 29999 that is free now."""
    for _ in range(1000):
        port = random.randrange(20_000, 30_000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port from 20000 to 29999")


class Server:
    """`conveyor serve` on a SQLite store in its own temporary directory."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="conveyor-py-")
        self.store = f"sqlite://{self.dir}/jobs.db"
        self.extra = list(extra or [])
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""

    def start(self, listen: Optional[str] = None) -> "Server":
        """Starts the server on ``listen``, by default a free port below the kernel's ephemeral
        range (so that while a test has it down for a restart, no outgoing connection or
        `127.0.0.1:0` listener elsewhere can take its port)."""
        if listen is not None:
            return self._start(listen)
        for _ in range(5):
            try:
                return self._start(f"127.0.0.1:{free_low_port()}")
            except RuntimeError:
                continue  # taken between the check and the server's bind
        raise RuntimeError("conveyor serve did not start on any port tried")

    def _start(self, listen: str) -> "Server":
        env = dict(os.environ, CONVEYOR_LOG="warn")
        env.pop("CONVEYOR_AUTH", None)
        self.proc = subprocess.Popen(
            [
                conveyor_bin(),
                "serve",
                "--listen",
                listen,
                "--store",
                self.store,
                "--maintenance-interval-ms",
                "100",
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().decode()
        words = [w for w in first.split() if w.startswith(("http://", "https://"))]
        if not words:
            self.kill()
            raise RuntimeError(f"conveyor serve did not start on {listen}: {first!r}")
        self.url = words[0]
        # Keep draining its stdout so it never blocks on a full pipe.
        out = self.proc.stdout
        threading.Thread(target=lambda: out.read(), daemon=True).start()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        """Kills the server (SIGKILL) and starts it again on the same port and store."""
        listen = self.url.split("://", 1)[1]
        self.kill()
        self.start(listen)

    def token(self, role: str) -> str:
        name = f"{role}-{uuid.uuid4().hex[:8]}"
        out = subprocess.run(
            [conveyor_bin(), "token", "create", "--role", role, "--name", name, "--store", self.store],
            capture_output=True,
            check=True,
            env=dict(os.environ, CONVEYOR_LOG="warn"),
        )
        return out.stdout.decode().strip()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(what: str, check: Callable[[], Optional[T]], timeout: float = 30.0) -> T:
    """Polls ``check`` every 20 ms until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Optional[T] = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})")


class Running:
    """Runs ``worker.run()`` in a thread (no signal handlers there); stops and joins it on
    exit, re-raising what ``run()`` raised."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.ready = threading.Event()
        self.error: BaseException | None = None
        worker.on_ready = self.ready.set
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.ready.set()

    def __enter__(self) -> "Running":
        self.thread.start()
        assert self.ready.wait(10), "the worker never started"
        return self

    def join(self, timeout: float = 30) -> float:
        started = time.monotonic()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        return time.monotonic() - started

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.join()


def make_certs(directory: str) -> dict:
    """A CA, a server certificate for 127.0.0.1 signed by it, a second CA for clients, a client
    certificate it signed, and one from a third CA; made with the `openssl` command (skips the
    test when there is none). The files' paths by name."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make test certificates")
    d = Path(directory)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def ca(name: str) -> None:
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"), "-days", "2",
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(name: str, issuer: str, extensions: str) -> None:
        (d / f"{name}.ext").write_text(extensions)
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"), "-subj", f"/CN={name}")
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{issuer}.crt"),
            "-CAkey", str(d / f"{issuer}.key"), "-CAcreateserial", "-days", "2",
            "-out", str(d / f"{name}.crt"), "-extfile", str(d / f"{name}.ext"))

    ca("server-ca")
    ca("clients-ca")
    ca("other-ca")
    leaf("server", "server-ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    leaf("client", "clients-ca", "extendedKeyUsage=clientAuth\n")
    leaf("intruder", "other-ca", "extendedKeyUsage=clientAuth\n")
    return {name: str(d / name) for name in (
        "server-ca.crt", "clients-ca.crt", "server.crt", "server.key",
        "client.crt", "client.key", "intruder.crt", "intruder.key",
    )}
