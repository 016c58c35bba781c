"""The per-request event stream: workers append, the API reads (and clients resume) by id.

A Redis Stream rather than pub/sub or the result backend: it can be read from the start, so no
event published before the reader attaches is lost, and SSE clients resume with Last-Event-ID.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.asyncio as aioredis
from ragline.broker.config.settings import RedisSettings
from ragline.broker.contract.messages import (
    FINAL_TYPES,
    ContractError,
    Done,
    Error,
    Sources,
    StreamEvent,
    Token,
    decode_event,
)
from ragline.broker.errors import RaglineError
from ragline.broker.limits.backpressure import Occupancy, count_done
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.memory_guard import MemoryGuard
from ragline.broker.streams.event_batcher import StreamWriteError

if TYPE_CHECKING:
    from ragline.broker.state.jobs import JobTracker
    from ragline.broker.streams.event_batcher import BatchedStream

log = logging.getLogger(__name__)

FINAL_EVENTS = FINAL_TYPES


# Stream replies as RESP2 gives them to a client that does not decode: (id, fields) entries, and
# XREAD's [(stream, entries)] (None when BLOCK ran out). redis-py's types cover RESP3's too.
_Entries = list[tuple[bytes, dict[bytes, bytes]]]
_StreamsReply = list[tuple[bytes, _Entries]] | None


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a request's stream: its id (the SSE id) and the decoded event."""

    id: str
    payload: StreamEvent

    @property
    def type(self) -> str:
        return self.payload.type


class FinishedStreamTtl:
    """How long a stream lives once its final event is written: ``done_ttl_s``, for a client
    that resumes it (the answer itself is in the job record or the result cache), and only
    ``linger_ttl_s`` while Redis is near its memory limit (the ``guard``'s reading, taken at
    most once a second), so finished streams give way like caches do.

    With a ``client`` it also remembers the streams it gave ``done_ttl_s`` (the last
    ``remember`` of them), and when the reading turns to near the limit cuts those still within
    their time to ``linger_ttl_s``: otherwise the streams finished just before the turn hold
    their memory for all of ``done_ttl_s``, which at a high request rate is most of the limit.
    Used from a worker's threads."""

    def __init__(
        self,
        done_ttl_s: int,
        linger_ttl_s: int,
        guard: MemoryGuard | None = None,
        *,
        client: redis.Redis | None = None,
        keys: Keys | None = None,
        remember: int = 50_000,
    ) -> None:
        self._done_ttl_s = done_ttl_s
        self._linger_ttl_s = linger_ttl_s
        self._guard = guard
        self._client = client
        self._keys = keys
        self._kept: deque[tuple[float, str]] = deque(maxlen=remember)
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls, client: redis.Redis, streams: RedisSettings, *, max_memory_fraction: float
    ) -> FinishedStreamTtl:
        guard = MemoryGuard(client, "stream", max_fraction=max_memory_fraction)
        return cls(
            streams.event_stream_done_ttl_s,
            streams.event_stream_linger_ttl_s,
            guard,
            client=client,
            keys=Keys(streams.key_prefix),
        )

    def seconds(self, request_ids: Iterable[str] = ()) -> int:
        """The time to live for the streams of ``request_ids``, about to be finished."""
        if self._guard is None:
            return self._done_ttl_s
        if self._guard.allows_write():
            if self._client is not None:
                now = time.monotonic()
                with self._lock:
                    self._kept.extend((now, request_id) for request_id in request_ids)
            return self._done_ttl_s
        self._cut_kept()
        return self._linger_ttl_s

    def _cut_kept(self) -> None:
        horizon = time.monotonic() - self._done_ttl_s
        with self._lock:
            kept = [request_id for at, request_id in self._kept if at > horizon]
            self._kept.clear()
        if not kept or self._client is None or self._keys is None:
            return
        pipe = self._client.pipeline(transaction=False)
        for request_id in kept:  # EXPIRE deletes nothing, so it runs even on a full Redis
            pipe.expire(self._keys.events(request_id), self._linger_ttl_s)
            pipe.expire(self._keys.stream_owner(request_id), self._linger_ttl_s)
        try:
            pipe.execute()
        except redis.RedisError:  # they expire at their own time instead
            log.warning("could not cut %d finished streams to their linger time", len(kept), exc_info=True)


class EventWriter:
    """Appends events for one request; used from worker threads.

    With a ``job`` tracker (the request is an async job) the events also drive the job record:
    ``sources`` moves it to ``generating``, and the final event is appended by the tracker in the
    same atomic step that finishes the job.

    With a ``batch`` (a generation worker's
    :class:`~ragline.broker.streams.event_batcher.EventBatcher` stream)
    token events go through the process's batcher instead of a round trip each; any other event
    waits until the tokens before it are written, so it lands after them.

    With an ``occupancy`` (the worker's :class:`~ragline.broker.limits.backpressure.Occupancy`) a completion
    also reports how many tasks the worker ran at once meanwhile, and how many it can.

    With a ``finished_ttl`` the final event leaves the stream to live that long instead of
    ``ttl_s`` (see :class:`FinishedStreamTtl`).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        request_id: str,
        *,
        ttl_s: int,
        maxlen: int,
        job: JobTracker | None = None,
        batch: BatchedStream | None = None,
        flush_timeout_s: float = 10.0,
        occupancy: Occupancy | None = None,
        finished_ttl: FinishedStreamTtl | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._request_id = request_id
        self._key = keys.events(request_id)
        self._owner_key = keys.stream_owner(request_id)
        self._ttl_s = ttl_s
        self._maxlen = maxlen
        self._job = job
        self._batch = batch
        self._flush_timeout_s = flush_timeout_s
        self._occupancy = occupancy
        self._finished_ttl = finished_ttl
        self._expiry_set = False

    def _final_ttl_s(self) -> int:
        if self._finished_ttl is None:
            return self._ttl_s
        return self._finished_ttl.seconds([self._request_id])

    @property
    def cancelled(self) -> bool:
        """The request was cancelled, as last seen by the batcher (False without one)."""
        return self._batch is not None and self._batch.cancelled

    def start(self, stage: str) -> bool:
        """A task begins ``stage`` of the request; False when the request already finished (a
        redelivered task must not answer twice) or its job is cancelled or gone."""
        if self.has_final():
            return False
        return self._job is None or self._job.start(stage)

    def emit(self, event: StreamEvent, *, completes: str | None = None, service_s: float = 0.0) -> None:
        """Append one event; ``completes`` names the queue whose task this event finishes, after
        ``service_s`` in the worker (the backpressure monitor counts it, in the same round trip)."""
        type_, data = event.type, event.encode()
        if self._batch is not None:
            if isinstance(event, Token):
                self._batch.append(type_, data)
                return
            try:
                self._batch.flush(timeout_s=self._flush_timeout_s)
            except StreamWriteError:
                if type_ not in FINAL_EVENTS:
                    raise
                # Tokens were lost to a Redis error; how the request ended (the whole answer, or
                # the error) must still reach the client: written directly, below.
                log.warning("%s: tokens lost, writing the final event directly", self._key)
        if self._job is not None:
            if isinstance(event, Done | Error):
                self._job.finish(self._key, event, stream_ttl_s=self._final_ttl_s(), maxlen=self._maxlen)
                if completes:
                    pipe = self._client.pipeline(transaction=False)
                    self._count_done(pipe, completes, service_s)
                    pipe.execute()
                return
            if isinstance(event, Sources):
                self._job.on_sources(event)
        pipe = self._client.pipeline(transaction=False)
        pipe.xadd(self._key, {"type": type_, "data": data}, maxlen=self._maxlen, approximate=True)
        # The TTL is set with the first event and renewed with the last: not once per token,
        # which on a CPU host takes cycles from the engine sharing the cores.
        if type_ in FINAL_EVENTS:
            # Who may resume the stream goes with it: a resume of a gone stream is a 404 at once.
            final_ttl_s = self._final_ttl_s()
            pipe.expire(self._key, final_ttl_s)
            pipe.expire(self._owner_key, final_ttl_s)
        elif not self._expiry_set:
            pipe.expire(self._key, self._ttl_s)
            self._expiry_set = True
        if completes:
            self._count_done(pipe, completes, service_s)
        pipe.execute()

    def _count_done(self, pipe: Any, queue: str, service_s: float) -> None:
        o = self._occupancy
        concurrency, slots = (o.mean(), o.slots) if o is not None else (1.0, 1)
        count_done(pipe, self._keys, queue, 1, service_s, concurrency=concurrency, slots=slots)

    def has_final(self) -> bool:
        """True when this request already finished (a redelivered task must not answer twice)."""
        return self._last_type() in FINAL_EVENTS

    def has_partial_answer(self) -> bool:
        """True when an earlier attempt at this request streamed tokens and stopped: the attempt
        starting now must say so (:class:`~ragline.broker.contract.messages.Restart`) before its
        own tokens."""
        return self._last_type() == Token.type

    def _last_type(self) -> str:
        last = cast(_Entries, self._client.xrevrange(self._key, count=1))
        return last[0][1].get(b"type", b"").decode() if last else ""


def emit_many(
    client: redis.Redis,
    keys: Keys,
    events: list[tuple[str, StreamEvent]],
    *,
    ttl_s: int,
    maxlen: int,
    completes: tuple[str, int, float] | None = None,
    finished_ttl: FinishedStreamTtl | None = None,
) -> None:
    """Append events for many requests in one round trip (a retrieval batch answers all at once).

    ``completes`` = (queue, requests, seconds in the worker): the task these events finish,
    counted for the backpressure monitor in the same round trip. A stream whose last event here
    is final lives as ``finished_ttl`` says (default ``ttl_s``) from now, the others ``ttl_s``.

    As one transaction: Redis answers a reader blocked on a stream after each command outside
    one, so a request's ``sources`` would reach its reader alone and its ``done`` take a second
    read; after EXEC every reader gets all of its events at once.
    """
    pipe = client.pipeline(transaction=True)
    streams: dict[str, bool] = {}  # request id -> finished
    for request_id, event in events:
        pipe.xadd(
            keys.events(request_id),
            {"type": event.type, "data": event.encode()},
            maxlen=maxlen,
            approximate=True,
        )
        streams[request_id] = event.type in FINAL_EVENTS
    finishing = [request_id for request_id, final in streams.items() if final]
    finished_ttl_s = ttl_s if finished_ttl is None else finished_ttl.seconds(finishing)
    # One TTL per stream, not one per event: inside the transaction it counts from the same moment.
    for request_id, final in streams.items():
        pipe.expire(keys.events(request_id), finished_ttl_s if final else ttl_s)
        if final:  # who may resume it goes with it
            pipe.expire(keys.stream_owner(request_id), finished_ttl_s)
    if completes:
        count_done(pipe, keys, *completes)
    pipe.execute()


def finished(client: redis.Redis, keys: Keys, request_ids: list[str]) -> set[str]:
    """Which of these requests already have their final event (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for request_id in request_ids:
        pipe.xrevrange(keys.events(request_id), count=1)
    done = set()
    for request_id, last in zip(request_ids, pipe.execute(), strict=True):
        if last and last[0][1].get(b"type", b"").decode() in FINAL_EVENTS:
            done.add(request_id)
    return done


def _decode(key: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Event:
    """The entry's event; one that does not match the contract ends the request with an error
    (the reader must not wait out its timeout for an answer that will never parse)."""
    try:
        return Event(entry_id.decode(), decode_event(fields[b"type"], fields[b"data"]))
    except (ContractError, KeyError) as exc:
        log.error("%s: entry %s breaks the event contract, ending the request: %s", key, entry_id, exc)
        return Event(entry_id.decode(), Error(status=500, message="a worker sent a malformed event"))


class EventTimeout(RaglineError):
    """No final event arrived before the deadline."""


async def read_events(
    client: aioredis.Redis,
    keys: Keys,
    request_id: str,
    *,
    after: str = "0-0",
    timeout_s: float,
    block_ms: int = 1000,
) -> AsyncIterator[Event]:
    """Yield the request's events after ``after`` until a final one, or raise EventTimeout."""
    key = keys.events(request_id)
    deadline = time.monotonic() + timeout_s
    last = after
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise EventTimeout(request_id)
        reply = cast(
            _StreamsReply, await client.xread({key: last}, block=min(block_ms, remaining_ms), count=256)
        )
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                event = _decode(key, entry_id, fields)
                last = event.id
                yield event
                if event.type in FINAL_EVENTS:
                    return
