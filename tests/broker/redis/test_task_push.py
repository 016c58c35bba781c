"""A task pushed from asyncio is the message Celery's own publish writes, and kombu consumes it;
the pusher pushes on the URL's database, survives a dropped connection and never waits past its
timeout."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import RedisSettings
from ragline.broker.redis.task_push import CLIENT_NAME, QueuePusher, task_message
from redis.exceptions import ResponseError

_KWARGS = {"requests": [{"request_id": "r1", "query": "what is asyncio?", "top_k": 5}]}
# Per message (ids, the sender, the tag) or chosen by the caller (the arguments' stand-in).
_PER_MESSAGE_HEADERS = {"id", "root_id", "origin", "kwargsrepr"}
_PER_MESSAGE_PROPERTIES = {"correlation_id", "reply_to", "delivery_tag"}


def _pushed(redis_url: str, queue: str, message: bytes) -> None:
    async def go() -> None:
        pusher = QueuePusher(redis_url, timeout_s=5)
        try:
            await pusher.push(queue, message)
        finally:
            await pusher.aclose()

    asyncio.run(go())


def _frame(raw: bytes) -> dict[str, Any]:
    frame = json.loads(raw)
    frame["body"] = json.loads(base64.b64decode(frame["body"]))
    return frame


def test_the_frame_is_the_one_send_task_writes(redis_url: str) -> None:
    app = create_celery(RedisSettings(redis_url=redis_url))
    theirs_q, ours_q = f"push-a-{uuid.uuid4().hex[:8]}", f"push-b-{uuid.uuid4().hex[:8]}"
    app.send_task("ragline.retrieve", kwargs=_KWARGS, queue=theirs_q)
    _pushed(
        redis_url, ours_q, task_message(app, "ragline.retrieve", _KWARGS, queue=ours_q, kwargsrepr="1 query")
    )
    sync = redis.Redis.from_url(redis_url)
    theirs, ours = _frame(sync.rpop(theirs_q)), _frame(sync.rpop(ours_q))

    assert ours.keys() == theirs.keys()
    assert ours["body"] == theirs["body"]
    assert ours["body"][1] == _KWARGS
    for field in ("content-type", "content-encoding"):
        assert ours[field] == theirs[field]
    assert ours["headers"].keys() == theirs["headers"].keys()
    for name, value in theirs["headers"].items():
        if name not in _PER_MESSAGE_HEADERS:
            assert ours["headers"][name] == value, name
    assert ours["headers"]["kwargsrepr"] == "1 query"
    assert ours["headers"]["root_id"] == ours["headers"]["id"] == ours["properties"]["correlation_id"]
    assert ours["properties"].keys() == theirs["properties"].keys()
    for name, value in theirs["properties"].items():
        if name not in _PER_MESSAGE_PROPERTIES and name != "delivery_info":
            assert ours["properties"][name] == value, name
    assert ours["properties"]["delivery_info"] == {"exchange": "", "routing_key": ours_q}
    assert theirs["properties"]["delivery_info"] == {"exchange": "", "routing_key": theirs_q}


def test_extra_headers_ride_as_send_tasks_do(redis_url: str) -> None:
    """The trace context (broker/tracing/propagation.py) is a header of the message, where
    ``send_task(headers=...)`` puts it, and a worker reads it back from its request."""
    app = create_celery(RedisSettings(redis_url=redis_url))
    extra = {
        "ragline_trace": {"r1": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
    }
    theirs_q, ours_q = f"push-a-{uuid.uuid4().hex[:8]}", f"push-b-{uuid.uuid4().hex[:8]}"
    app.send_task("ragline.retrieve", kwargs=_KWARGS, queue=theirs_q, headers=extra)
    message = task_message(
        app, "ragline.retrieve", _KWARGS, queue=ours_q, kwargsrepr="1 query", headers=extra
    )
    _pushed(redis_url, ours_q, message)
    sync = redis.Redis.from_url(redis_url)
    theirs, ours = _frame(sync.rpop(theirs_q)), _frame(sync.rpop(ours_q))
    assert ours["headers"]["ragline_trace"] == theirs["headers"]["ragline_trace"] == extra["ragline_trace"]
    assert ours["headers"].keys() == theirs["headers"].keys()


def test_a_kombu_consumer_takes_it_as_a_json_task(redis_url: str) -> None:
    app = create_celery(RedisSettings(redis_url=redis_url))
    queue = f"push-{uuid.uuid4().hex[:8]}"
    message = task_message(app, "ragline.retrieve", _KWARGS, queue=queue, kwargsrepr="1 query")
    _pushed(redis_url, queue, message)

    received: list[tuple[Any, Any]] = []
    with Connection(redis_url) as conn:
        channel = conn.channel()
        with Consumer(
            channel, [Queue(queue)], callbacks=[lambda b, m: received.append((b, m))], accept=["json"]
        ):
            deadline = time.monotonic() + 5
            while not received and time.monotonic() < deadline:
                conn.drain_events(timeout=1)
        assert len(received) == 1
        body, delivered = received[0]
        assert delivered.headers["task"] == "ragline.retrieve"
        assert body == [[], _KWARGS, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        assert delivered.delivery_info["routing_key"] == queue
        delivered.ack()
    assert redis.Redis.from_url(redis_url).llen(queue) == 0


def test_errors_come_back_and_a_dropped_connection_is_replaced(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    queue, not_a_list = f"push-{uuid.uuid4().hex[:8]}", f"push-str-{uuid.uuid4().hex[:8]}"
    sync.set(not_a_list, "x")

    async def go() -> None:
        pusher = QueuePusher(redis_url, timeout_s=5)
        try:
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await pusher.push(not_a_list, b"m")
            await pusher.push(queue, b"after an error")
            ours = [c for c in sync.client_list() if c["name"] == CLIENT_NAME]
            assert ours
            for client in ours:  # Redis drops the pusher's connections
                sync.client_kill(client["addr"])
            await pusher.push(queue, b"after a reconnect")
        finally:
            await pusher.aclose()

    asyncio.run(go())
    assert sync.lrange(queue, 0, -1) == [b"after a reconnect", b"after an error"]


def test_a_push_redis_does_not_answer_fails_after_its_timeout() -> None:
    async def go() -> None:
        # A listener that accepts and never answers: the push must not wait for ever.
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pusher = QueuePusher(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
        try:
            # The listener still holds the connection: only the push's own timeout ends it (a
            # push without one would hang until this bound, whose error names no timeout).
            async with asyncio.timeout(30):
                with pytest.raises(Exception, match=r"(?i)timeout|timed out"):
                    await pusher.push("q", b"m")
        finally:
            await pusher.aclose()
            server.close()

    asyncio.run(go())
