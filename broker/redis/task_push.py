"""Publishing a Celery task from asyncio: one LPUSH of the message Celery's own publish writes.

kombu publishes with blocking I/O, so the API ran it on a thread; the thread hop and kombu's
work per publish were the largest part of what ragline adds to a lone retrieval, and under load
they took the event loop's GIL. Celery builds the message
(``app.amqp.as_task_v2``: protocol 2 headers and body), this module frames it as kombu's Redis
transport does (a JSON envelope, the body base64-encoded, pushed on the queue's list of priority
0) and :class:`QueuePusher` sends it. The worker cannot tell the two apart: tests compare the
frame with one that ``send_task`` wrote, and a real worker runs what this module pushes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from ragline.broker.redis.pool import Endpoint, async_client_at

_PERSISTENT = 2  # kombu's delivery_mode for a message that survives a broker restart


def task_message(
    app: Celery,
    name: str,
    kwargs: dict[str, Any],
    *,
    queue: str,
    kwargsrepr: str,
    headers: dict[str, Any] | None = None,
) -> bytes:
    """The frame for task ``name`` with ``kwargs`` on ``queue``, as kombu's Redis transport stores it.

    ``kwargsrepr`` stands in for the arguments in logs and monitors (Flower); Celery's default
    is a repr of every argument, which for a batch of queries costs more than the publish.
    ``headers`` are added to the message's, as ``send_task(headers=...)`` adds them (the trace
    context, ``broker/tracing/propagation.py``).
    """
    task_id = str(uuid.uuid4())
    # ignore_result None, as send_task leaves it: the task's own setting decides.
    message = app.amqp.as_task_v2(
        task_id, name, kwargs=kwargs, kwargsrepr=kwargsrepr, origin=_ORIGIN, ignore_result=None
    )
    if headers:
        message.headers.update(headers)
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


_ORIGIN = anon_nodename()
# How operators (CLIENT LIST) and tests tell the publishing connections apart.
CLIENT_NAME = "ragline-task-push"


class QueuePusher:
    """LPUSH of task frames through redis-py's asyncio client, on a pool of its own.

    Its own pool keeps a publish from queueing behind the XREADs that wait for answers on the
    API's shared pool.
    """

    def __init__(self, url: str, *, timeout_s: float, sentinel_password: str = "") -> None:
        # Connection errors are retried (pool.py): a connection Redis closed while it sat in the
        # pool (a restart, say), or a primary lost and replaced by a replica (Sentinel).
        self._redis = async_client_at(
            Endpoint(url, timeout_s, timeout_s, sentinel_password), client_name=CLIENT_NAME
        )

    def push(self, queue: str, message: bytes) -> asyncio.Future[None]:
        """Enqueue a frame from :func:`task_message`; the future fails after the timeout."""
        return asyncio.ensure_future(self._push(queue, message))

    async def _push(self, queue: str, message: bytes) -> None:
        await self._redis.lpush(queue, message)

    async def aclose(self) -> None:
        await self._redis.aclose()
