"""The per-request event stream on a real Redis: order, resume, final events, expiry."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import Done, Error, Restart, Sources, Token
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.memory_guard import MemoryGuard
from ragline.broker.streams.events import EventTimeout, EventWriter, FinishedStreamTtl, emit_many, read_events

from tests.helpers import fill_to, redis_server

KEYS = Keys("ragline-test-events")


def _writer(client: redis.Redis, request_id: str) -> EventWriter:
    return EventWriter(client, KEYS, request_id, ttl_s=60, maxlen=1000)


async def _collect(url: str, request_id: str, after: str = "0-0", timeout_s: float = 5) -> list:
    client = aioredis.Redis.from_url(url)
    try:
        return [e async for e in read_events(client, KEYS, request_id, after=after, timeout_s=timeout_s)]
    finally:
        await client.aclose()


def test_events_in_order_and_resume(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    w = _writer(client, rid)
    assert not w.has_final()
    w.emit(Sources(sources=[]))
    for piece in ("a", "b", "c"):
        w.emit(Token(text=piece))
    w.emit(Done(answer="abc"))
    assert w.has_final()  # a redelivered task sees this and does nothing

    events = asyncio.run(_collect(redis_url, rid))
    assert [e.type for e in events] == ["sources", "token", "token", "token", "done"]
    resumed = asyncio.run(_collect(redis_url, rid, after=events[2].id))
    assert [e.id for e in resumed] == [e.id for e in events[3:]]
    assert 0 < client.ttl(KEYS.events(rid)) <= 60


def test_a_second_attempt_after_tokens_is_marked_a_restart(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    first = _writer(client, rid)
    first.emit(Sources(sources=[]))
    assert not first.has_partial_answer()  # killed before a token: nothing to take back
    first.emit(Token(text="par"))
    # the worker dies here; the redelivered task's writer:
    second = _writer(client, rid)
    assert second.start("generating") and second.has_partial_answer()
    second.emit(Restart())
    assert not second.has_partial_answer()
    for piece in ("whole ", "answer"):
        second.emit(Token(text=piece))
    second.emit(Done(answer="whole answer"))

    joined = ""
    for event in asyncio.run(_collect(redis_url, rid)):
        if isinstance(event.payload, Restart):
            joined = ""
        elif isinstance(event.payload, Token):
            joined += event.payload.text
        elif isinstance(event.payload, Done):
            assert joined == event.payload.answer


def test_reader_waits_for_events_written_later(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex

    async def scenario() -> list:
        reader = asyncio.create_task(_collect(redis_url, rid))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(_writer(client, rid).emit, Done(answer="late"))
        return await reader

    events = asyncio.run(scenario())
    assert [e.payload for e in events] == [Done(answer="late")]


def test_reader_times_out(redis_url: str) -> None:
    with pytest.raises(EventTimeout):
        asyncio.run(_collect(redis_url, uuid.uuid4().hex, timeout_s=0.3))


def test_stream_expires_from_its_first_event_and_again_from_its_last(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    key = KEYS.events(rid)
    w = EventWriter(client, KEYS, rid, ttl_s=60, maxlen=1000)
    w.emit(Sources(sources=[]))
    assert 0 < client.ttl(key) <= 60
    client.expire(key, 30)
    w.emit(Token(text="a"))  # tokens leave the TTL alone
    assert client.ttl(key) <= 30
    w.emit(Done(answer="a"))
    assert client.ttl(key) > 30
    client.delete(key)


def test_a_finished_stream_and_its_owner_live_the_done_ttl(redis_url: str) -> None:
    """Running: the stream's TTL; once final: the (shorter) done TTL, and who may resume it goes
    with it, so a resume after it is gone is a 404, not a wait on a stream that will never come."""
    client = redis.Redis.from_url(redis_url)
    rid, batched = uuid.uuid4().hex, uuid.uuid4().hex
    for request_id in (rid, batched):
        client.set(KEYS.stream_owner(request_id), "alice", ex=600)  # as the API records it
    w = EventWriter(client, KEYS, rid, ttl_s=600, maxlen=1000, finished_ttl=FinishedStreamTtl(20, 2))
    w.emit(Sources(sources=[]))
    assert 20 < client.ttl(KEYS.events(rid)) <= 600
    w.emit(Done(answer="a"))
    assert 0 < client.ttl(KEYS.events(rid)) <= 20 and 0 < client.ttl(KEYS.stream_owner(rid)) <= 20

    running = uuid.uuid4().hex  # a rag request: its sources now, generation later
    emit_many(
        client,
        KEYS,
        [(batched, Sources(sources=[])), (batched, Done(answer=None)), (running, Sources(sources=[]))],
        ttl_s=600,
        maxlen=1000,
        finished_ttl=FinishedStreamTtl(20, 2),
    )
    assert 0 < client.ttl(KEYS.events(batched)) <= 20 and 0 < client.ttl(KEYS.stream_owner(batched)) <= 20
    assert client.ttl(KEYS.events(running)) > 20


@pytest.mark.redis  # a redis-server of its own
def test_near_the_memory_limit_a_finished_stream_only_lingers(tmp_path: Path) -> None:
    with redis_server(tmp_path, maxmemory="16mb") as client:
        ttl = FinishedStreamTtl(120, 5, MemoryGuard(client, "stream", max_fraction=0.7))
        assert ttl.seconds() == 120
        fill_to(client, 0.8)
        ttl = FinishedStreamTtl(120, 5, MemoryGuard(client, "stream", max_fraction=0.7))
        rid = uuid.uuid4().hex
        w = EventWriter(client, KEYS, rid, ttl_s=600, maxlen=1000, finished_ttl=ttl)
        w.emit(Sources(sources=[]))
        w.emit(Done(answer="a"))
        assert 0 < client.ttl(KEYS.events(rid)) <= 5


@pytest.mark.redis  # a redis-server of its own
def test_streams_finished_just_before_the_memory_limit_are_cut_to_linger(tmp_path: Path) -> None:
    """A stream finished with the full time to live is cut to the linger time once Redis nears
    its limit, so the last minutes' streams do not hold the memory the queues need."""
    with redis_server(tmp_path, maxmemory="16mb") as client:
        guard = MemoryGuard(client, "stream", max_fraction=0.7, refresh_s=0)
        ttl = FinishedStreamTtl(120, 5, guard, client=client, keys=KEYS)
        early, batched, later = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
        w = EventWriter(client, KEYS, early, ttl_s=600, maxlen=1000, finished_ttl=ttl)
        w.emit(Done(answer="a"))
        emit_many(client, KEYS, [(batched, Done(answer=None))], ttl_s=600, maxlen=1000, finished_ttl=ttl)
        assert client.ttl(KEYS.events(early)) > 5 and client.ttl(KEYS.events(batched)) > 5
        fill_to(client, 0.8)
        EventWriter(client, KEYS, later, ttl_s=600, maxlen=1000, finished_ttl=ttl).emit(Done(answer="b"))
        for rid in (early, batched, later):
            assert 0 < client.ttl(KEYS.events(rid)) <= 5


def test_a_batch_reaches_a_waiting_reader_whole(redis_url: str) -> None:
    """Each request's sources and done arrive in one read (Redis would answer a blocked reader
    after the first XADD of a plain pipeline)."""
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    first_read: list = []

    def wait_for_events() -> None:
        reader = redis.Redis.from_url(redis_url)
        first_read.extend(reader.xread({KEYS.events(rid): "0-0"}, block=5000, count=256))

    waiting = threading.Thread(target=wait_for_events)
    waiting.start()
    time.sleep(0.3)  # the reader is blocked by now
    emit_many(
        client,
        KEYS,
        [(rid, Sources(sources=[])), (rid, Done(answer=None))],
        ttl_s=60,
        maxlen=1000,
    )
    waiting.join(10)
    [(_stream, entries)] = first_read
    assert [fields[b"type"] for _id, fields in entries] == [b"sources", b"done"]
    assert 0 < client.ttl(KEYS.events(rid)) <= 60


@pytest.mark.parametrize(
    ("type_", "data"),
    [(b"done", b'{"answer": "a", "colour": "red"}'), (b"progress", b"{}"), (b"token", b"?")],
)
def test_an_entry_that_breaks_the_contract_ends_the_request_with_an_error(
    redis_url: str, type_: bytes, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    _writer(client, rid).emit(Sources(sources=[]))
    client.xadd(KEYS.events(rid), {"type": type_, "data": data})
    _writer(client, rid).emit(Done(answer="never read"))
    events = asyncio.run(_collect(redis_url, rid))
    assert [e.type for e in events] == ["sources", "error"]
    assert events[1].payload == Error(status=500, message="a worker sent a malformed event")
    assert "breaks the event contract" in caplog.text
