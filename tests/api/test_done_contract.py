"""Every field of a worker's `done` reaches the JSON answer, the SSE `done` and the job record.

A real request through real workers, for both ways an answer is made: an early exit (the
retrieval worker answers with the best source) and a generated answer whose prompt dropped
sources to fit its budget. Each is asked three ways (POST /v1/query, POST /v1/query/stream,
POST /v1/jobs), each with a question of its own so that no answer comes from the result cache,
and each answer is compared with the `done` its worker wrote to the request's stream. Then a
cached answer, as JSON and replayed as SSE, must carry the same fields.

A stack of its own (API, retrieval and generation workers on another Redis database): the
early exit is a retrieval worker's setting, and the source budget a generation worker's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Done, Timings
from ragline.broker.redis.keys import Keys

from tests.helpers import parse_sse, redis_db_after, stack_on_db

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

# What only the API knows, set on the worker's `done` by whoever answers.
_API_TIMINGS = {"total_ms", "predicted_wait_ms"}


@dataclass
class Stack:
    settings: Settings
    client: httpx.Client
    redis: redis.Redis

    def worker_done(self, request_id: str) -> dict[str, Any]:
        """The `done` event as the worker wrote it to the request's stream."""
        entries = self.redis.xrange(Keys(self.settings.redis.key_prefix).events(request_id))
        (data,) = [fields[b"data"] for _id, fields in entries if fields[b"type"] == b"done"]
        return json.loads(data)

    def ask_json(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        reply = self.client.post("/v1/query", json=body)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        return answer, self.worker_done(answer["request_id"])

    def ask_sse(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str | None, str, dict]]]:
        with self.client.stream("POST", "/v1/query/stream", json=body) as r:
            assert r.status_code == 200, r.read()
            events = list(parse_sse(r.iter_lines()))
        assert events[-1][1] == "done", events
        return events[-1][2], events

    def ask_job(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        reply = self.client.post("/v1/jobs", json=body)
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["job_id"]
        deadline = time.monotonic() + 300
        while (job := self.client.get(f"/v1/jobs/{job_id}").json())["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["status"] == "done", job
        return job, self.worker_done(job_id)


@pytest.fixture(scope="module")
def stack(
    settings: Settings, prepared_model: Path, test_index: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # Two databases after the session's (the next one is the durability tests').
    url = redis_db_after(settings.redis.redis_url, 2, "RAGLINE_TEST_CONTRACT_REDIS_URL")
    with (
        stack_on_db(
            settings,
            url,
            ("retrieval", "generation"),
            tmp_path_factory.mktemp("contract-logs"),
            # A café question's best source clears this; requests that must generate opt out.
            early_exit_score=0.3,
            # Room for about one test document: of five sources, the lowest-scored are dropped.
            max_source_tokens=120,
            # Admission must not degrade the generated answers on a busy host.
            default_deadline_ms=180_000,
            max_num_seqs=4,
        ) as running,
        httpx.Client(base_url=running.base, timeout=300) as client,
    ):
        yield Stack(running.settings, client, running.redis)


def assert_carries_every_done_field(answer: dict[str, Any], worker: dict[str, Any], *, via: str) -> None:
    """``answer`` has every field of Done, each with the worker's value (timings: the API adds
    only its own)."""
    assert set(Done.model_fields) <= answer.keys(), f"{via}: missing {set(Done.model_fields) - answer.keys()}"
    assert set(Timings.model_fields) <= answer["timings"].keys(), via
    for name in Done.model_fields.keys() - {"timings"}:
        assert answer[name] == worker[name], (
            f"{via}: {name} is {answer[name]!r}, the worker said {worker[name]!r}"
        )
    for name, value in worker["timings"].items():
        if name not in _API_TIMINGS:
            assert answer["timings"][name] == value, f"{via}: timings.{name}"
    assert answer["timings"]["total_ms"] > 0, via


EARLY_EXIT = {
    "json": "When does Café Lumière open in the morning?",
    "sse": "What time does Café Lumière open?",
    "job": "At what hour does Café Lumière open its doors?",
}
GENERATED = {
    "json": "What is the house speciality of Café Lumière?",
    "sse": "Which bun is Café Lumière known for?",
    "job": "Are dogs welcome on the terrace of Café Lumière?",
}


def _ask_three_ways(stack: Stack, questions: dict[str, str], **extra: Any) -> dict[str, dict[str, Any]]:
    """Each question its way, each answer checked against its worker's `done`; returns the
    worker's `done` of each way, and the JSON answer itself as "answer"."""
    answer, worker = stack.ask_json({"query": questions["json"], **extra})
    assert_carries_every_done_field(answer, worker, via="JSON")
    assert answer["cached"] is False
    dones = {"answer": answer, "json": worker}

    done, events = stack.ask_sse({"query": questions["sse"], **extra})
    worker = stack.worker_done(done["request_id"])
    assert_carries_every_done_field(done, worker, via="SSE done")
    assert events[0][1] == "sources"
    dones["sse"] = worker

    job, worker = stack.ask_job({"query": questions["job"], **extra})
    assert_carries_every_done_field(job["result"], worker, via="job result")
    dones["job"] = worker
    return dones


def _cached_json(stack: Stack, body: dict[str, Any]) -> dict[str, Any]:
    """The JSON answer once the result cache has it (it is stored after the first answer left)."""
    deadline = time.monotonic() + 10
    while not (hit := stack.client.post("/v1/query", json=body).json())["cached"]:
        assert time.monotonic() < deadline, "the answer never reached the result cache"
        time.sleep(0.1)
    return hit


def test_an_early_exit_reaches_every_answer_whole(stack: Stack) -> None:
    body = {"top_k": 3}
    asked = _ask_three_ways(stack, EARLY_EXIT, **body)
    for way in ("json", "sse", "job"):
        done = asked[way]
        assert done["early_exit"] is True and "Café Lumière" in done["answer"], way
        assert done["usage"] is None and done["timings"]["generation_ms"] == 0, way
        assert done["timings"]["first_token_ms"] is None and done["timings"]["retrieval_ms"] > 0, way

    # The first answer again, from the result cache: as JSON, and replayed as a stream.
    first = asked["answer"]
    hit = _cached_json(stack, {"query": EARLY_EXIT["json"], **body})
    done, events = stack.ask_sse({"query": EARLY_EXIT["json"], **body})
    assert [e[1] for e in events] == ["sources", "token", "done"]
    assert events[1][2]["text"] == first["answer"]
    for cached, via in ((hit, "cached JSON"), (done, "replayed SSE done")):
        assert cached["cached"] is True, via
        assert cached["request_id"] != first["request_id"], via
        same = Done.model_fields.keys() - {"cached"}
        assert {k: cached[k] for k in same} == {k: first[k] for k in same}, via


def test_a_generated_answer_reaches_every_answer_whole(stack: Stack) -> None:
    asked = _ask_three_ways(stack, GENERATED, top_k=5, allow_early_exit=False)
    for way in ("json", "sse", "job"):
        done = asked[way]
        assert done["early_exit"] is False and done["answer"], way
        assert done["sources_dropped"] >= 1, f"{way}: the source budget keeps about one of five"
        assert done["usage"]["prompt_tokens"] > 0 and done["usage"]["completion_tokens"] > 0, way
        t = done["timings"]
        assert t["generation_ms"] >= t["first_token_ms"] > 0 and t["retrieval_ms"] > 0, way
    assert len(asked["answer"]["sources"]) == 5  # the answer lists what was retrieved, dropped or not
