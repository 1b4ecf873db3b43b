"""HTTPS: `conveyor serve --tls-cert --tls-key --tls-client-ca` with certificates the test makes;
the client and the worker trust the server's CA and present a client certificate through
``ssl_context``; a client without an accepted certificate, or over plain HTTP, is refused."""

from __future__ import annotations

import ssl
import tempfile
from typing import Any, Dict, Optional

import pytest

from conveyor_client import Client, TransportError, Worker
from support import Running, Server, make_certs, wait_for


@pytest.fixture(scope="module")
def tls_server():  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory(prefix="conveyor-py-tls-") as directory:
        certs = make_certs(directory)
        srv = Server(
            [
                "--tls-cert", certs["server.crt"],
                "--tls-key", certs["server.key"],
                "--tls-client-ca", certs["clients-ca.crt"],
            ]
        ).start()
        yield srv, certs
        srv.close()


def context(certs: Dict[str, str], client: Optional[str] = "client") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs["server-ca.crt"])
    if client is not None:
        ctx.load_cert_chain(certs[f"{client}.crt"], certs[f"{client}.key"])
    return ctx


def test_a_client_with_an_accepted_certificate_is_served(tls_server: Any, queue: str) -> None:
    srv, certs = tls_server
    assert srv.url.startswith("https://")
    with Client(srv.url, ssl_context=context(certs)) as client:
        job_id = client.enqueue("tls.ping", {"n": 1}, queue=queue)
        job = client.get(job_id)
        assert job.id == job_id
        assert job.payload == {"n": 1}


def test_no_certificate_another_ca_or_plain_http_is_refused(tls_server: Any, queue: str) -> None:
    srv, certs = tls_server
    for ctx in (context(certs, None), context(certs, "intruder")):
        with Client(srv.url, ssl_context=ctx) as client:
            with pytest.raises(TransportError):
                client.enqueue("tls.ping", queue=queue)
    # Not trusting the server's CA: the client refuses the server.
    with Client(srv.url) as client:
        with pytest.raises(TransportError):
            client.enqueue("tls.ping", queue=queue)
    with Client(srv.url.replace("https://", "http://", 1)) as client:
        with pytest.raises(TransportError):
            client.enqueue("tls.ping", queue=queue)


def test_a_worker_runs_jobs_over_https(tls_server: Any, queue: str) -> None:
    srv, certs = tls_server
    worker = Worker(srv.url, queues=[queue], poll_wait=1, ssl_context=context(certs))

    @worker.handler("tls.work")
    def work(job: Any) -> Any:
        return {"doubled": job.payload["n"] * 2}

    with Client(srv.url, ssl_context=context(certs)) as client:
        job_id = client.enqueue("tls.work", {"n": 21}, queue=queue)
        with Running(worker):
            job = wait_for("the job to complete", lambda: _completed(client, job_id))
        assert job.result == {"doubled": 42}


def _completed(client: Client, job_id: str) -> Any:
    job = client.get(job_id)
    return job if job.state == "completed" else None
