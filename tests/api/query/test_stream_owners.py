"""Who may resume a stream is kept in Redis no longer than the stream itself (a real Redis)."""

from __future__ import annotations

import asyncio
import uuid

import redis
import redis.asyncio as aioredis
from ragline.api.pipeline.connect import StreamOwners
from ragline.broker.contract.messages import Done, Sources
from ragline.broker.redis.keys import Keys
from ragline.broker.streams.events import EventWriter, FinishedStreamTtl

KEYS = Keys("ragline-test-owners")


def _record(redis_url: str, request_id: str) -> None:
    async def run() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await StreamOwners(client, KEYS, ttl_s=600).record(request_id, "alice")
        finally:
            await client.aclose()

    asyncio.run(run())


def test_an_owner_recorded_after_its_request_finished_goes_with_the_stream(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    finished, running = uuid.uuid4().hex, uuid.uuid4().hex
    fast = EventWriter(client, KEYS, finished, ttl_s=600, maxlen=100, finished_ttl=FinishedStreamTtl(20, 2))
    fast.emit(Done(answer="a"))  # answered before the API got to record its owner
    EventWriter(client, KEYS, running, ttl_s=600, maxlen=100).emit(Sources(sources=[]))
    for request_id in (finished, running):
        _record(redis_url, request_id)
    assert 0 < client.ttl(KEYS.stream_owner(finished)) <= 20
    assert client.ttl(KEYS.stream_owner(running)) > 20
    assert client.get(KEYS.stream_owner(finished)) == b"alice"
