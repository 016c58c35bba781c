"""Token events of every request in a process, appended by one thread, one round trip per round.

A generation worker has up to ``max_num_seqs`` requests in the engine, and each engine step
yields a token for each of them. Written by each task thread, that is one XADD round trip per
token, plus one cancel-flag EXISTS per request every ~100 ms: on a CPU host every one of them
takes cycles from the engine sharing the cores. Here a single thread writes whatever arrived
while its previous write was in flight (a whole engine step's tokens, usually) as one pipeline,
and asks in the same round trip whether any of those requests was cancelled.

Order holds per request: one thread writes, first in, first out. :meth:`BatchedStream.flush`
returns once everything appended before it is in Redis, so a final event written after it
always comes after the last token.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from ragline.broker.errors import RaglineError
from ragline.broker.redis.keys import Keys

log = logging.getLogger(__name__)

_STOP = object()


class StreamWriteError(RaglineError, RuntimeError):
    """A batch holding this request's events could not be written."""


@dataclass(eq=False, slots=True)
class BatchedStream:
    """One request's side of the batcher: append token events, learn of a cancel, flush."""

    _batcher: EventBatcher
    key: str
    cancel_key: str
    expiry_set: bool = False
    next_cancel_check: float = 0.0
    cancelled: bool = False
    error: BaseException | None = None

    def append(self, type_: str, data: str) -> None:
        """Queue one encoded event; never blocks. Raises if an earlier write of this request failed."""
        self._raise_if_failed()
        self._batcher.put((self, {"type": type_, "data": data}))

    def flush(self, *, timeout_s: float) -> None:
        """Wait until every event appended so far is in Redis; raise if one could not be written."""
        done = threading.Event()
        self._batcher.put(done)
        if not done.wait(timeout_s):
            raise StreamWriteError(f"events of {self.key} not written within {timeout_s:.0f} s")
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise StreamWriteError(f"writing events to {self.key} failed: {self.error}") from self.error


class EventBatcher:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        ttl_s: int,
        maxlen: int,
        cancel_check_every_s: float = 0.1,
    ) -> None:
        self._client = client
        self._keys = keys
        self._ttl_s = ttl_s
        self._maxlen = maxlen
        self._cancel_every_s = cancel_check_every_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="event-batcher", daemon=True)
        self._thread.start()

    def stream(self, request_id: str) -> BatchedStream:
        return BatchedStream(self, self._keys.events(request_id), self._keys.cancel(request_id))

    def put(self, item: Any) -> None:
        """Hand the writer thread an event (a ``(stream, fields)`` pair) or a flush barrier."""
        self._queue.put(item)

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in items)
            self._write([item for item in items if item is not _STOP])
            if stop:
                return

    def _write(self, items: list[Any]) -> None:
        pipe = self._client.pipeline(transaction=False)
        streams: list[BatchedStream] = []
        checked: list[tuple[int, BatchedStream]] = []  # (reply index, stream) of each cancel check
        barriers: list[threading.Event] = []
        now = time.monotonic()
        for item in items:
            if isinstance(item, threading.Event):
                barriers.append(item)
                continue
            stream, fields = item
            streams.append(stream)
            pipe.xadd(stream.key, fields, maxlen=self._maxlen, approximate=True)
            if not stream.expiry_set:
                # With the first event: a stream whose worker dies mid-answer still expires.
                pipe.expire(stream.key, self._ttl_s)
                stream.expiry_set = True
            if now >= stream.next_cancel_check and not stream.cancelled:
                stream.next_cancel_check = now + self._cancel_every_s
                checked.append((len(pipe.command_stack), stream))
                pipe.exists(stream.cancel_key)
        if streams:
            try:
                replies = pipe.execute()
            except Exception as exc:  # a Redis error, or one of ours: fail these requests, keep going
                log.warning("writing %d events failed: %s", len(streams), exc)
                for stream in streams:
                    stream.error = exc
            else:
                for index, stream in checked:
                    stream.cancelled = bool(replies[index])  # only asked while not cancelled
        for barrier in barriers:
            barrier.set()
