"""Which requests of a retrieval batch a run serves, and a job cancelled during its retrieval:
real Redis for the streams and cancel flags, narrow fakes for the jobs' event writers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from ragline.broker.contract.messages import Cancelled, RetrieveRequest, RetrieveTask
from ragline.broker.redis.keys import Keys
from ragline.broker.streams.cancel import request_cancel
from ragline.workers.retrieval.batch_jobs import BatchJobs
from ragline.workers.task_call import Skip, TaskCall

pytestmark = pytest.mark.integration


@dataclass
class FakeJobWriter:
    startable: bool = True
    started: list[str] = field(default_factory=list)
    emitted: list[Any] = field(default_factory=list)

    def start(self, stage: str) -> bool:
        self.started.append(stage)
        return self.startable

    def emit(self, event: Any, **_: Any) -> None:
        self.emitted.append(event)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield c
    c.close()


@pytest.fixture
def keys(client: redis.Redis) -> Iterator[Keys]:
    prefix = f"ragline-test-batch-jobs-{uuid.uuid4().hex[:8]}"
    yield Keys(prefix)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


def _request(request_id: str, job_id: str | None = None) -> RetrieveRequest:
    return RetrieveRequest(
        request_id=request_id,
        query="q",
        top_k=3,
        mode="rag",
        index="test",
        enqueued_at=time.time(),
        job_id=job_id,
    )


def _call(*requests: RetrieveRequest, redelivered: bool = False) -> TaskCall[RetrieveTask]:
    call: TaskCall[RetrieveTask] = TaskCall("ragline.retrieve", {}, redelivered=redelivered)
    call.payload = RetrieveTask(requests=list(requests))
    return call


def test_a_first_delivery_asks_nothing_and_leaves_out_cancelled_jobs(keys: Keys) -> None:
    writers = {"r2": FakeJobWriter(), "r3": FakeJobWriter(startable=False)}

    def no_redis() -> redis.Redis:
        raise AssertionError("a first delivery has no finished request to look for")

    hook = BatchJobs("retrieving", no_redis, keys, lambda rid, job: writers[rid])  # type: ignore[arg-type,return-value]
    call = _call(_request("r1"), _request("r2", "j2"), _request("r3", "j3"))
    hook.before(call)
    serving = hook.serving(call)
    assert [r.request_id for r in serving.pending] == ["r1", "r2"]
    assert set(serving.writers) == {"r2", "r3"} and writers["r2"].started == ["retrieving"]


def test_a_redelivered_batch_leaves_out_the_requests_that_finished(client: redis.Redis, keys: Keys) -> None:
    client.xadd(keys.events("r1"), {"type": "done", "data": "{}"})
    client.xadd(keys.events("r2"), {"type": "sources", "data": "{}"})
    hook = BatchJobs("retrieving", lambda: client, keys, lambda rid, job: FakeJobWriter())  # type: ignore[arg-type,return-value]
    call = _call(_request("r1"), _request("r2"), redelivered=True)
    hook.before(call)
    assert [r.request_id for r in hook.serving(call).pending] == ["r2"]

    with pytest.raises(Skip):  # nothing left to serve
        hook.before(_call(_request("r1"), redelivered=True))


def test_a_job_cancelled_during_its_retrieval_ends_cancelled_and_goes_no_further(
    client: redis.Redis, keys: Keys
) -> None:
    writer = FakeJobWriter()
    hook = BatchJobs("retrieving", lambda: client, keys, lambda rid, job: writer)  # type: ignore[arg-type,return-value]
    call = _call(_request("plain"), _request("job", "j1"))
    hook.before(call)
    assert not hook.stopped_for_cancel(call, "job") and writer.emitted == []
    request_cancel(client, keys, "job", ttl_s=60)
    request_cancel(client, keys, "plain", ttl_s=60)  # a plain query's cancel is the API's to handle
    assert hook.stopped_for_cancel(call, "job") and writer.emitted == [Cancelled()]
    assert not hook.stopped_for_cancel(call, "plain")
