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

import redis.asyncio as aioredis
from celery import Celery
from celery.utils.nodenames import anon_nodename
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

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


_ORIGIN = anon_nodename()
# How operators (CLIENT LIST) and tests tell the publishing connections apart.
CLIENT_NAME = "ragline-task-push"


class QueuePusher:
    """LPUSH of task frames through redis-py's asyncio client, on a pool of its own.

    Its own pool keeps a publish from queueing behind the XREADs that wait for answers on the
    API's shared pool.
    """

    def __init__(self, url: str, *, timeout_s: float) -> None:
        # One retry, on a connection error only: its usual cause is a connection Redis closed while
        # it sat in the pool (a restart, say), which the command never reached.
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            client_name=CLIENT_NAME,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )

    def push(self, queue: str, message: bytes) -> asyncio.Future[None]:
        """Enqueue a frame from :func:`task_message`; the future fails after the timeout."""
        return asyncio.ensure_future(self._push(queue, message))

    async def _push(self, queue: str, message: bytes) -> None:
        await self._redis.lpush(queue, message)

    async def aclose(self) -> None:
        await self._redis.aclose()
