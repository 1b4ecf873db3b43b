"""A Conveyor worker in Python: `python worker.py` (Ctrl-C or SIGTERM drains and exits).

CONVEYOR_URL (default http://127.0.0.1:7700) and, with access control on, CONVEYOR_TOKEN
(`conveyor token create --role worker`).
"""

import asyncio
import logging
import os

from conveyor_client import Permanent, Retry, RetryAfter, Worker

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

worker = Worker(
    os.environ.get("CONVEYOR_URL", "http://127.0.0.1:7700"),
    queues=["mail", "default"],
    concurrency=10,
    token=os.environ.get("CONVEYOR_TOKEN"),
)


# An async handler runs on the worker's event loop; its return value is the job's result.
@worker.handler("send_welcome_email")
async def send_welcome_email(job):
    user_id = (job.payload or {}).get("user_id")
    if user_id is None:
        raise Permanent("payload has no user_id")  # dead at once, no retries
    if user_id == 7 and job.attempt == 1:
        raise RetryAfter(2, "mail server busy")  # again in 2 s
    await asyncio.sleep(0.05)  # cancelled if the job is cancelled meanwhile (lease lost)
    print(f"sent welcome email to user {user_id} (attempt {job.attempt})", flush=True)
    return {"sent": True, "user_id": user_id}


# A plain function runs in a thread pool (blocking libraries are fine there).
@worker.handler("flaky")
def flaky(job):
    if job.attempt < 2:
        raise Retry(f"attempt {job.attempt} failed, trying again")  # the server's backoff
    return {"ok": True}


# Any other exception retries with its class (here TypeError) and traceback recorded.
@worker.handler("broken")
def broken(job):
    return None + 1


if __name__ == "__main__":
    worker.run()  # until Ctrl-C / SIGTERM: stops fetching, finishes running jobs, releases the rest
    print("worker stopped")
