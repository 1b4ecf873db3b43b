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

Batches (a kind whose jobs are handed out up to 500 at a time, to one call)::

    client.set_batch("rows.insert", max_size=500, max_wait=0.2)

    @worker.batch_handler("rows.insert")
    def insert_rows(jobs):
        db.insert_many([job.payload for job in jobs])
        return None                                    # or one result (or exception) per job

Workflows::

    from conveyor_client import chain, group, step, wait_step
    flow = client.create_flow(chain([
        step("fetch", "fetch_page", {"url": "https://example.com"}),
        group([step("thumbs", "thumbnails"), step("text", "extract_text")]),
        wait_step("review", "approved"),
        step("publish", "publish_page"),
    ]), name="publish")
    client.signal(flow.id, "approved", {"by": "ana"})
    done = client.wait_flow(flow.id, timeout=600)

    @worker.handler("publish_page")
    async def publish(job):
        await job.progress(50, "uploading")
        return {"text": job.parents["text"], "review": job.parents["review"]}
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
from .flows import Steps, chain, group, step, wait_step
from .models import (
    BatchSettings,
    BlockedBy,
    BreakerSettings,
    BreakerView,
    CreatedFlow,
    ErrorRecord,
    FlowPage,
    FlowView,
    Job,
    JobSequence,
    KeyUsage,
    Lease,
    LeasedJob,
    Limit,
    LimitRate,
    LimitView,
    NewJob,
    Progress,
    SequenceBlockedBy,
    StepError,
    StepView,
)
from .worker import Worker, error_class_name

__all__ = [
    "__version__",
    "AsyncClient",
    "BatchSettings",
    "BlockedBy",
    "BreakerSettings",
    "BreakerView",
    "Client",
    "Conflict",
    "ConveyorError",
    "CreatedFlow",
    "ErrorRecord",
    "FlowPage",
    "FlowView",
    "Forbidden",
    "InvalidRequest",
    "Job",
    "JobSequence",
    "KeyUsage",
    "Lease",
    "LeaseLost",
    "LeasedJob",
    "Limit",
    "LimitRate",
    "LimitView",
    "NewJob",
    "NotFound",
    "PayloadTooLarge",
    "Permanent",
    "Progress",
    "QueueFull",
    "Retry",
    "RetryAfter",
    "SequenceBlockedBy",
    "ServerError",
    "StepError",
    "StepView",
    "Steps",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "chain",
    "error_class_name",
    "group",
    "step",
    "wait_step",
]
