"""Access control: tokens, 401 and 403, for the client and the worker."""

from __future__ import annotations

import pytest

from conveyor_client import Client, ConveyorError, Forbidden, Unauthorized, Worker


@pytest.fixture(scope="module")
def auth_server():
    from support import Server

    srv = Server(["--auth"]).start()
    srv.tokens = {role: srv.token(role) for role in ("admin", "producer", "worker")}
    yield srv
    srv.close()


def test_missing_or_bad_token_is_401(auth_server):
    with Client(auth_server.url) as anonymous:
        with pytest.raises(Unauthorized) as caught:
            anonymous.enqueue("x")
    err = caught.value
    assert (err.status, err.code) == (401, "unauthorized")
    assert isinstance(err, ConveyorError)
    assert "401" in str(err)
    bad = "cv_" + "0" * 32 + "_" + "0" * 64
    with Client(auth_server.url, token=bad) as client:
        with pytest.raises(Unauthorized):
            client.get("00000000-0000-0000-0000-000000000000")


def test_roles(auth_server):
    tokens = auth_server.tokens
    with Client(auth_server.url, token=tokens["producer"]) as producer:
        job_id = producer.enqueue("x", {"a": 1})
        assert producer.get(job_id).payload == {"a": 1}
        with pytest.raises(Forbidden) as caught:
            producer.cancel(job_id)  # admins cancel
        assert (caught.value.status, caught.value.code) == (403, "forbidden")
    with Client(auth_server.url, token=tokens["admin"]) as admin:
        assert admin.cancel(job_id).state == "cancelled"


def _worker(url, token):
    worker = Worker(url, queues=["auth-q"], token=token, poll_wait=1)

    @worker.handler("x")
    def handle(job):
        return None

    return worker


def test_worker_with_a_bad_token_stops_with_401(auth_server):
    worker = _worker(auth_server.url, "cv_" + "1" * 32 + "_" + "1" * 64)
    with pytest.raises(Unauthorized) as caught:
        worker.run()
    assert "401" in str(caught.value)


def test_worker_with_a_producer_token_stops_with_403(auth_server):
    worker = _worker(auth_server.url, auth_server.tokens["producer"])
    with pytest.raises(Forbidden) as caught:
        worker.run()
    assert "403" in str(caught.value)
    assert "worker or admin role" in str(caught.value)


def test_worker_with_a_worker_token_runs_jobs(auth_server):
    tokens = auth_server.tokens
    with Client(auth_server.url, token=tokens["producer"]) as producer:
        job_id = producer.enqueue("x", queue="auth-q")
        worker = Worker(auth_server.url, queues=["auth-q"], token=tokens["worker"], poll_wait=1)

        @worker.handler("x")
        def handle(job):
            worker.stop()
            return {"ran": job.id}

        worker.run()
        job = producer.get(job_id)
        assert job.state == "completed" and job.result == {"ran": job_id}
