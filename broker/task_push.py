"""Publishing a Celery task from asyncio: one LPUSH of the message Celery's own publish writes.

kombu publishes with blocking I/O, so the API ran it on a thread; the thread hop and kombu's
work per publish (1.5 ms on these machines, traced) were the largest part of what ragline adds
to a lone retrieval, and under load they took the event loop's GIL. Celery builds the message
(``app.amqp.as_task_v2``: protocol 2 headers and body), this module frames it as kombu's Redis
transport does (a JSON envelope, the body base64-encoded, pushed on the queue's list) and sends it
with the caller's asyncio client. The worker cannot tell the two apart: tests compare the frame
with one that ``send_task`` wrote, and a real worker runs what this module pushes.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import redis.asyncio as aioredis
from celery import Celery
from celery.utils.nodenames import anon_nodename

_PERSISTENT = 2  # kombu's delivery_mode for a message that survives a broker restart


def task_message(app: Celery, name: str, kwargs: dict[str, Any], *, queue: str, kwargsrepr: str) -> bytes:
    """The frame for task ``name`` with ``kwargs`` on ``queue``, as kombu's Redis transport stores it.

    ``kwargsrepr`` stands in for the arguments in logs and monitors (Flower); Celery's default
    is a repr of every argument, which for a batch of queries costs more than the publish.
    """
    task_id = str(uuid.uuid4())
    # ignore_result None, as send_task leaves it: the task's own setting decides.
    message = app.amqp.as_task_v2(
        task_id, name, kwargs=kwargs, kwargsrepr=kwargsrepr, origin=_ORIGIN, ignore_result=None
    )
    body = json.dumps(message.body).encode()
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": message.headers,
        "properties": {
            **message.properties,
            "delivery_mode": _PERSISTENT,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(envelope).encode()


async def push(client: aioredis.Redis, queue: str, message: bytes) -> None:
    """Enqueue a frame from :func:`task_message` (priority 0: the queue's own list)."""
    await client.lpush(queue, message)


_ORIGIN = anon_nodename()
