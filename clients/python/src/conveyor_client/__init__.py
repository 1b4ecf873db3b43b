"""Python client for Conveyor, durable background jobs over HTTP.

Producers::

    from conveyor_client import Client
    client = Client("http://127.0.0.1:7700")
    job_id = client.enqueue("send_email", {"to": "a@example.com"}, delay=30)

Workers::

    from conveyor_client import Worker, Retry
    worker = Worker("http://127.0.0.1:7700", queues=["default"], concurrency=10)

    @worker.handler("send_email")
    async def send_email(job):
        ...
        return {"sent": True}

    worker.run()
"""

from ._version import __version__
from .client import AsyncClient, Client
from .errors import (
    Conflict,
    ConveyorError,
    Forbidden,
    InvalidRequest,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    Permanent,
    QueueFull,
    Retry,
    RetryAfter,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
)
from .models import ErrorRecord, Job, Lease, LeasedJob, NewJob
from .worker import Worker, error_class_name

__all__ = [
    "__version__",
    "AsyncClient",
    "Client",
    "Conflict",
    "ConveyorError",
    "ErrorRecord",
    "Forbidden",
    "InvalidRequest",
    "Job",
    "Lease",
    "LeaseLost",
    "LeasedJob",
    "NewJob",
    "NotFound",
    "PayloadTooLarge",
    "Permanent",
    "QueueFull",
    "Retry",
    "RetryAfter",
    "ServerError",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "error_class_name",
]
