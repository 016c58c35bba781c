"""Jobs under failure, on real processes: a generation worker SIGKILLed mid-job, and a cancel
mid-generation.

These run their own API and workers on a separate Redis database (the session workers would
otherwise take the tasks), with a short visibility timeout (how soon Redis hands a dead worker's
task to another) and generations forced to 256 tokens so that there is time to interrupt them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys

from tests.helpers import Proc, redis_db_after, stack_on_db, wait_healthy
from tests.webhook_receiver import Receiver, running_receiver

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

LONG_TOKENS = 256
VISIBILITY_TIMEOUT_S = 8


@dataclass
class Stack:
    settings: Settings
    client: httpx.Client
    redis: redis.Redis
    api: Proc
    generation: Proc

    def tokens(self, job_id: str) -> int:
        events = self.redis.xrange(Keys(self.settings.redis.key_prefix).events(job_id))
        return sum(1 for _id, fields in events if fields[b"type"] == b"token")

    def joined_tokens(self, job_id: str) -> str:
        """The answer a reader of the stream joins: the tokens after the last ``restart``."""
        joined = ""
        for _id, fields in self.redis.xrange(Keys(self.settings.redis.key_prefix).events(job_id)):
            if fields[b"type"] == b"restart":
                joined = ""
            elif fields[b"type"] == b"token":
                joined += json.loads(fields[b"data"])["text"]
        return joined

    def finals(self, job_id: str) -> list[bytes]:
        events = self.redis.xrange(Keys(self.settings.redis.key_prefix).events(job_id))
        return [fields[b"type"] for _id, fields in events if fields[b"type"] in (b"done", b"error")]

    def job(self, job_id: str) -> dict:
        reply = self.client.get(f"/v1/jobs/{job_id}")
        assert reply.status_code == 200, reply.text
        return reply.json()

    def wait(self, job_id: str, ok: callable, timeout: float, what: str) -> dict:  # type: ignore[valid-type]
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if ok(job):
                return job
            assert time.monotonic() < deadline, f"{what}: {job}\n{self.generation.tail()}"
            time.sleep(0.1)

    def wait_generating(self, job_id: str, min_tokens: int = 3) -> dict:
        return self.wait(
            job_id,
            lambda j: j["status"] == "generating" and self.tokens(job_id) >= min_tokens,
            timeout=120,
            what="never generating",
        )


@pytest.fixture(scope="module")
def stack(
    settings: Settings, prepared_model: Path, test_index: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # The next database after the session's.
    url = redis_db_after(settings.redis.redis_url, 1, "RAGLINE_TEST_ALT_REDIS_URL")
    with (
        stack_on_db(
            settings,
            url,
            ("retrieval", "generation", "callbacks"),
            tmp_path_factory.mktemp("durability-logs"),
            visibility_timeout_s=VISIBILITY_TIMEOUT_S,
            max_new_tokens=LONG_TOKENS,
            min_new_tokens=LONG_TOKENS,
            max_num_seqs=4,
        ) as running,
        httpx.Client(base_url=running.base, timeout=30) as client,
    ):
        yield Stack(running.settings, client, running.redis, running.api, running.workers["generation"])


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def test_cancel_aborts_a_running_generation(stack: Stack, receiver: Receiver) -> None:
    url = receiver.url()
    job_id = stack.client.post(
        "/v1/jobs", json={"query": "Tell me about Café Lumière.", "webhook_url": url}
    ).json()["job_id"]
    stack.wait_generating(job_id)

    reply = stack.client.delete(f"/v1/jobs/{job_id}")
    assert reply.status_code == 200, reply.text
    job = reply.json()
    assert job["status"] == "cancelled" and job["error"]["status"] == 499 and job["result"] is None

    time.sleep(0.5)  # the task checks the flag between deltas, at most every ~100 ms
    stopped_at = stack.tokens(job_id)
    time.sleep(2.0)
    assert stack.tokens(job_id) == stopped_at < LONG_TOKENS, "generation went on after the cancel"

    (hook,) = receiver.wait(url, 1, timeout=30)
    assert b'"status":"cancelled"' in hook.body
    assert stack.client.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"  # idempotent
    time.sleep(1.0)
    assert len(receiver.received(url)) == 1


def test_generation_worker_killed_mid_job_finishes_once(stack: Stack, receiver: Receiver) -> None:
    url = receiver.url()
    reply = stack.client.post("/v1/jobs", json={"query": "When does Café Lumière open?", "webhook_url": url})
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["job_id"]
    stack.wait_generating(job_id)

    # The whole process group: the worker alone would leave its engine core running.
    gen = stack.generation.proc
    assert gen is not None
    os.killpg(gen.pid, signal.SIGKILL)
    gen.wait(30)
    tokens_before = stack.tokens(job_id)
    assert 0 < tokens_before < LONG_TOKENS
    assert stack.job(job_id)["status"] == "generating"
    assert receiver.received(url) == []

    # A new worker: Redis hands it the dead worker's unacknowledged task once the visibility
    # timeout has passed, and it generates the answer again from the start.
    stack.generation.start()
    job = stack.wait(job_id, lambda j: j["status"] != "generating", timeout=600, what="not redelivered")
    assert job["status"] == "done", job
    assert job["result"]["usage"]["completion_tokens"] == LONG_TOKENS
    assert job["result"]["answer"]
    assert stack.finals(job_id) == [b"done"]  # one final event, one result
    assert stack.tokens(job_id) > tokens_before
    assert stack.joined_tokens(job_id) == job["result"]["answer"]  # the restart is marked

    (hook,) = receiver.wait(url, 1, timeout=30)
    assert b'"status":"done"' in hook.body
    # Past another visibility timeout: no late duplicate of the task or the webhook.
    time.sleep(VISIBILITY_TIMEOUT_S + 4)
    assert len(receiver.received(url)) == 1
    assert stack.finals(job_id) == [b"done"]
    job = stack.job(job_id)
    assert job["webhook"]["status"] == "delivered" and job["webhook"]["attempts"] == 1

    # The record lives in Redis: an API restart does not lose it.
    stack.api.stop()
    stack.api.start()
    wait_healthy(str(stack.client.base_url).rstrip("/"), stack.api)
    assert stack.job(job_id)["result"] == job["result"]
    assert stack.client.delete(f"/v1/jobs/{job_id}").status_code == 409
