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
import ssl
import uuid
from collections import deque
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

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


class QueuePusher:
    """LPUSH of task frames on a connection of its own, written to the socket in the call.

    The API publishes the next batch at the moment a batch comes back, which is also when that
    batch's answers wake every request waiting for them. Through redis-py's asyncio client the
    write itself waits for the event loop's next turn, behind those wake-ups and the responses
    they write, a wait that grows with the batch, with the worker idle all along. Here the
    command leaves in :meth:`push` and a future carries the reply. The connection sends nothing
    but AUTH, SELECT and LPUSH, so only simple replies (+OK, -ERR, :n) are read.
    """

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self._options = parse_url(url)
        self._timeout_s = timeout_s
        self._replies: _Replies | None = None
        self._connecting: asyncio.Task[_Replies] | None = None

    def push(self, queue: str, message: bytes) -> asyncio.Future[None]:
        """Enqueue a frame from :func:`task_message`; the future fails after the timeout."""
        loop = asyncio.get_running_loop()
        command = _command(b"LPUSH", queue.encode(), message)
        result: asyncio.Future[None] = loop.create_future()
        if self._replies is not None and self._replies.open:
            _chain(self._replies.send(command), result)
        else:
            _chain(loop.create_task(self._send_connected(command)), result)
        timer = loop.call_later(self._timeout_s, self._expire, result)
        result.add_done_callback(lambda _: timer.cancel())
        return result

    async def aclose(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._replies is not None:
            self._replies.close()

    def _expire(self, result: asyncio.Future[None]) -> None:
        if not result.done():
            result.set_exception(TimeoutError(f"Redis did not answer an LPUSH within {self._timeout_s}s"))
            if self._replies is not None:
                self._replies.close()  # a stalled connection: the next push connects afresh

    async def _send_connected(self, command: bytes) -> object:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        replies = await asyncio.shield(self._connecting)
        return await replies.send(command)

    async def _connect(self) -> _Replies:
        options, loop = self._options, asyncio.get_running_loop()
        async with asyncio.timeout(self._timeout_s):
            if "path" in options:
                _, replies = await loop.create_unix_connection(_Replies, options["path"])
            else:
                tls = ssl.create_default_context() if "connection_class" in options else None
                _, replies = await loop.create_connection(
                    _Replies, options.get("host", "localhost"), options.get("port", 6379), ssl=tls
                )
            setup = []
            if options.get("password"):
                user = [options["username"].encode()] if options.get("username") else []
                setup.append(replies.send(_command(b"AUTH", *user, options["password"].encode())))
            if options.get("db"):
                setup.append(replies.send(_command(b"SELECT", str(options["db"]).encode())))
            for reply in setup:
                await reply
        self._replies = replies
        return replies


class _Replies(asyncio.Protocol):
    """One connection's replies, in the order its commands were written."""

    def __init__(self) -> None:
        self.open = False
        self._transport: asyncio.Transport | None = None
        self._waiting: deque[asyncio.Future[bytes]] = deque()
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.open = True

    def send(self, command: bytes) -> asyncio.Future[bytes]:
        if not self.open or self._transport is None:
            raise RedisConnectionError("the task queue connection is closed")
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting.append(reply)
        self._transport.write(command)
        return reply

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\r\n" in self._buffer and self._waiting:
            line, _, self._buffer = self._buffer.partition(b"\r\n")
            reply = self._waiting.popleft()
            if reply.done():
                continue
            if line.startswith(b"-"):
                reply.set_exception(ResponseError(line[1:].decode(errors="replace")))
            else:
                reply.set_result(line)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        while self._waiting:
            reply = self._waiting.popleft()
            if not reply.done():
                reply.set_exception(RedisConnectionError(f"the task queue connection was lost: {exc!r}"))

    def close(self) -> None:
        self.open = False
        if self._transport is not None:
            self._transport.close()


def _command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _chain(source: asyncio.Future[Any], result: asyncio.Future[None]) -> None:
    """Settle ``result`` as ``source`` settles (its value dropped)."""

    def copy(done: asyncio.Future[Any]) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
        elif (exc := done.exception()) is not None:
            result.set_exception(exc)
        else:
            result.set_result(None)

    source.add_done_callback(copy)
