"""The pipeline's real parts, wired without Redis: the publisher a batch leaves through, the
count of live retrieval workers, and streams' owners, each on a narrow fake of what it calls.
Their Redis side is exercised by tests/api/pipeline/test_fast_path.py and the query tests."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis
from ragline.api.pipeline import connect
from ragline.api.pipeline.admission import Admission
from ragline.api.pipeline.connect import PipelineResources, RetrievalWorkers, StreamOwners
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import RetrieveRequest
from ragline.broker.contract.queues import RETRIEVAL_QUEUE, RETRIEVE_TASK
from ragline.broker.redis.keys import Keys

from tests import virtual_clock

# Nothing listens there; and in the unit tier no connection to a Redis is made at all.
SETTINGS = Settings().replace(redis_url="redis://127.0.0.1:1/0", key_prefix="t-connect")
KEYS = Keys("t-connect")


# -- PipelineResources: what leaves for the queues ---------------------------------------------------------


class FakePusher:
    """QueuePusher's interface: records each frame, decoded."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.pushed: list[tuple[str, dict[str, Any]]] = []
        self.closed = False

    def push(self, queue: str, message: bytes) -> asyncio.Future[None]:
        self.pushed.append((queue, json.loads(message)))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def aclose(self) -> None:
        self.closed = True


def _connected(monkeypatch: pytest.MonkeyPatch) -> tuple[PipelineResources, list[FakePusher]]:
    pushers: list[FakePusher] = []

    def pusher(url: str, *, timeout_s: float, sentinel_password: str = "") -> FakePusher:
        pushers.append(FakePusher(url, timeout_s=timeout_s))
        return pushers[-1]

    monkeypatch.setattr(connect, "QueuePusher", pusher)
    client = aioredis.Redis.from_url(SETTINGS.redis.redis_url)  # connects on first use only
    admission = Admission(SETTINGS.api, None)
    return PipelineResources(SETTINGS, client, create_celery(SETTINGS.redis), admission), pushers


def _request(request_id: str) -> RetrieveRequest:
    return RetrieveRequest(
        request_id=request_id, query="q", top_k=3, mode="rag", index="docs", enqueued_at=time.time()
    )


def test_a_batch_leaves_as_one_retrieve_task_on_the_retrieval_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    connected, (pusher,) = _connected(monkeypatch)

    async def go() -> None:
        await connected.pipeline.coalescer.submit(_request("r1"))
        await connected.aclose()

    asyncio.run(go())
    assert pusher.url == SETTINGS.redis.redis_url and pusher.timeout_s > 0  # every push is bounded
    ((queue, frame),) = pusher.pushed
    assert queue == RETRIEVAL_QUEUE
    headers = frame["headers"]
    assert headers["task"] == RETRIEVE_TASK
    assert headers["kwargsrepr"] == "{'requests': <1 queries>}"  # not every query in the logs
    assert pusher.closed


def test_another_kind_of_task_goes_to_its_own_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    connected, (pusher,) = _connected(monkeypatch)

    async def go() -> None:
        await connected.send("ingest", "ragline.ingest", {"job_id": "j1"}, kwargsrepr="{'job_id': 'j1'}")
        await connected.aclose()

    asyncio.run(go())
    ((queue, frame),) = pusher.pushed
    assert queue == "ingest" and frame["headers"]["task"] == "ragline.ingest"
    assert frame["headers"]["kwargsrepr"] == "{'job_id': 'j1'}"


# -- RetrievalWorkers: recounted in the background, never waited for -------------------------------


class Counts:
    """liveness.live_counts, scripted: each call takes the next answer (a number or an error)."""

    def __init__(self, *answers: int | BaseException) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(
        self, client: object, keys: Keys, queues: tuple[str, ...], ttl_s: float
    ) -> dict[str, int]:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if answer < 0:  # a Redis that does not answer
            await asyncio.sleep(3600)
        return {RETRIEVAL_QUEUE: answer}


def _workers(monkeypatch: pytest.MonkeyPatch, counts: Counts) -> RetrievalWorkers:
    monkeypatch.setattr(connect.liveness, "live_counts", counts)
    # Its clock is the loop's (virtual): a second passes when the test sleeps one.
    monkeypatch.setattr(connect, "time", SimpleNamespace(monotonic=lambda: asyncio.get_running_loop().time()))
    return RetrievalWorkers(object(), KEYS, heartbeat_ttl_s=6.0)  # type: ignore[arg-type]  # never reached


def test_one_worker_is_assumed_until_counted_then_the_count_stands_for_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = Counts(3, 0)

    async def go() -> list[int]:
        await asyncio.sleep(5)  # the loop's clock is past the first second
        workers = _workers(monkeypatch, counts)
        seen = [workers()]  # the first call starts a count and does not wait for it
        await asyncio.sleep(0.5)
        seen += [workers(), workers()]
        await asyncio.sleep(1)
        seen.append(workers())  # a second later: recounted in the background
        await asyncio.sleep(0)
        seen.append(workers())
        return seen

    # Zero live workers still leaves one batch in flight (a worker may be starting).
    assert virtual_clock.run(go()) == [1, 3, 3, 3, 1]
    assert counts.calls == 2


@pytest.mark.parametrize("failure", [ConnectionError("down"), -1], ids=["fails", "hangs"])
def test_a_count_that_fails_or_hangs_keeps_the_last_one(
    monkeypatch: pytest.MonkeyPatch, failure: BaseException | int
) -> None:
    counts = Counts(2, failure, 4)

    async def go() -> list[int]:
        await asyncio.sleep(5)
        workers = _workers(monkeypatch, counts)
        workers()
        await asyncio.sleep(2)
        seen = [workers()]  # 2, and a recount starts that fails or hangs
        await asyncio.sleep(2)  # a hung count gave up after its bound
        seen.append(workers())  # still 2; the next recount starts
        await asyncio.sleep(0)
        seen.append(workers())
        return seen

    assert virtual_clock.run(go()) == [2, 2, 4]


# -- StreamOwners: an owner never outlives its stream ----------------------------------------------


class OwnerRedis:
    """The calls StreamOwners makes, on dicts; ``stream_ttl`` is what TTL answers for the stream."""

    def __init__(self, stream_ttl: int) -> None:
        self.stream_ttl = stream_ttl
        self.values: dict[str, tuple[bytes, int]] = {}

    def pipeline(self, *, transaction: bool) -> OwnerRedis:
        self._queued: list[Any] = []
        return self

    def set(self, key: str, value: str, *, ex: int) -> None:
        self.values[key] = (value.encode(), ex)
        self._queued.append(True)

    def ttl(self, key: str) -> None:
        self._queued.append(self.stream_ttl)

    async def execute(self) -> list[Any]:
        return self._queued

    async def expire(self, key: str, seconds: int) -> None:
        value, _ = self.values[key]
        self.values[key] = (value, seconds)

    async def get(self, key: str) -> bytes | None:
        held = self.values.get(key)
        return held[0] if held else None


@pytest.mark.parametrize(
    ("stream_ttl", "owner_ttl"),
    [
        (-2, 600),  # no stream yet: the request is still on its way
        (-1, 600),  # a stream without a TTL (not ours to shorten to)
        (900, 600),  # a live stream: the owner's own TTL
        (60, 60),  # a finished stream: the owner goes with it
    ],
)
def test_an_owner_lives_as_long_as_its_stream_at_most(stream_ttl: int, owner_ttl: int) -> None:
    client = OwnerRedis(stream_ttl)
    owners = StreamOwners(client, KEYS, ttl_s=600)  # type: ignore[arg-type]  # the fake's calls only

    async def go() -> tuple[str | None, str | None]:
        await owners.record("r1", "alice")
        return await owners.owner_of("r1"), await owners.owner_of("r2")

    assert asyncio.run(go()) == ("alice", None)
    assert client.values[KEYS.stream_owner("r1")] == (b"alice", owner_ttl)
