"""Enqueues a few jobs and waits for the first to finish: `python enqueue.py`."""

import datetime as dt
import os
import time

from conveyor_client import Client, QueueFull

client = Client(
    os.environ.get("CONVEYOR_URL", "http://127.0.0.1:7700"),
    token=os.environ.get("CONVEYOR_TOKEN"),  # `conveyor token create --role producer` with access control on
)

first = client.enqueue(
    "send_welcome_email",
    {"user_id": 42},
    queue="mail",
    max_attempts=5,
    idempotency_key=f"welcome-42-{dt.date.today()}",  # once a day at most
)
later = client.enqueue("send_welcome_email", {"user_id": 7}, queue="mail", delay=5)  # in 5 s
batch = client.enqueue_many(
    [
        {"kind": "flaky", "payload": {}},
        {"kind": "broken", "payload": {}, "max_attempts": 2},
        {"kind": "send_welcome_email", "payload": {}, "queue": "mail"},  # no user_id: dead at once
    ]
)
print("enqueued", [first, later, *batch])

try:
    client.enqueue("send_welcome_email", {"user_id": 1}, queue="mail")
except QueueFull as err:  # only when the queue has a max_depth
    print(f"queue full, retry in {err.retry_after} s")

while True:
    job = client.get(first)
    if job.state in ("completed", "dead", "cancelled"):
        print(f"job {job.id}: {job.state}, result {job.result}")
        break
    time.sleep(0.2)
