"""The generation worker's event batcher on a real Redis: order, round trips, cancel, failure."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import Done, Error, Token
from ragline.broker.redis.keys import Keys
from ragline.broker.streams.cancel import request_cancel
from ragline.broker.streams.event_batcher import EventBatcher, StreamWriteError
from ragline.broker.streams.events import EventWriter, read_events
from redis.backoff import NoBackoff
from redis.retry import Retry

KEYS = Keys("ragline-test-batcher")


class CountingClient(redis.Redis):
    """A real client that counts pipeline round trips."""

    round_trips = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(*args: Any, **kwargs: Any) -> Any:
            CountingClient.round_trips += 1
            return execute(*args, **kwargs)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


def _unreachable() -> redis.Redis:
    """A client of a port nothing listens on that fails at once (redis-py retries for seconds)."""
    return redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))


async def _collect(url: str, request_id: str) -> list:
    client = aioredis.Redis.from_url(url)
    try:
        return [e async for e in read_events(client, KEYS, request_id, timeout_s=5)]
    finally:
        await client.aclose()


def test_tokens_of_many_requests_in_order_in_few_round_trips(redis_url: str) -> None:
    client = CountingClient.from_url(redis_url)
    batcher = EventBatcher(client, KEYS, ttl_s=60, maxlen=1000)
    rids = [uuid.uuid4().hex for _ in range(16)]
    tokens = 50
    go = threading.Event()

    def generate(rid: str) -> None:
        writer = EventWriter(client, KEYS, rid, ttl_s=60, maxlen=1000, batch=batcher.stream(rid))
        go.wait()
        for i in range(tokens):
            writer.emit(Token(text=str(i)))
        writer.emit(Done(answer="all"))  # waits for the tokens before it

    CountingClient.round_trips = 0
    threads = [threading.Thread(target=generate, args=(rid,)) for rid in rids]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(30)
    batcher.close()

    for rid in rids:
        events = asyncio.run(_collect(redis_url, rid))
        assert [e.type for e in events] == ["token"] * tokens + ["done"]
        assert [e.payload.text for e in events[:-1]] == [str(i) for i in range(tokens)]
        assert 0 < client.ttl(KEYS.events(rid)) <= 60
    events_written = len(rids) * (tokens + 1)
    # One pipeline per round, not one round trip per token (the done events are one each).
    assert CountingClient.round_trips < events_written / 2, CountingClient.round_trips


def test_cancel_flag_is_seen_in_the_write_round_trip_at_most_every_interval(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    rarely = EventBatcher(client, KEYS, ttl_s=60, maxlen=1000, cancel_check_every_s=3600)
    stream = rarely.stream(rid)
    stream.append("token", Token(text="a").encode())
    stream.flush(timeout_s=5)  # the first write asked: not cancelled
    request_cancel(client, KEYS, rid, ttl_s=30)
    stream.append("token", Token(text="b").encode())
    stream.flush(timeout_s=5)
    assert not stream.cancelled  # not asked again within the interval
    rarely.close()

    often = EventBatcher(client, KEYS, ttl_s=60, maxlen=1000, cancel_check_every_s=0)
    seen = often.stream(rid)
    seen.append("token", Token(text="c").encode())
    seen.flush(timeout_s=5)
    assert seen.cancelled
    writer = EventWriter(client, KEYS, rid, ttl_s=60, maxlen=1000, batch=seen)
    assert writer.cancelled
    often.close()


def test_a_failed_write_fails_its_requests_and_the_batcher_goes_on(redis_url: str) -> None:
    down = _unreachable()
    batcher = EventBatcher(down, KEYS, ttl_s=60, maxlen=1000)
    stream = batcher.stream(uuid.uuid4().hex)
    stream.append("token", Token(text="lost").encode())
    with pytest.raises(StreamWriteError, match="failed"):  # the write's error, not flush's timeout
        stream.flush(timeout_s=30)
    with pytest.raises(StreamWriteError):
        stream.append("token", Token(text="again").encode())
    other = batcher.stream(uuid.uuid4().hex)
    other.flush(timeout_s=5)  # nothing appended: nothing failed, and the thread still answers
    batcher.close()


def test_after_a_failed_token_write_the_final_event_still_gets_through(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    down = _unreachable()
    batcher = EventBatcher(down, KEYS, ttl_s=60, maxlen=1000)
    rid = uuid.uuid4().hex
    writer = EventWriter(client, KEYS, rid, ttl_s=60, maxlen=1000, batch=batcher.stream(rid))
    writer.emit(Token(text="lost"))
    writer.emit(Error(status=500, message="generation failed"))  # straight to Redis
    events = asyncio.run(_collect(redis_url, rid))
    assert [e.type for e in events] == ["error"]
    batcher.close()
