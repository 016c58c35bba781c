"""The semantic cache through a real stack: an API with keys, a retrieval worker, Redis.

A question answered once answers a close enough question of the same key, index version and
options, as JSON and replayed as a stream, marked ``cached: "semantic"`` with the question it
matched; never another key's, never a degraded answer, never one below the threshold. Asked in
retrieval mode (no generation worker here): the cache treats both modes alike, and its answer is
whatever the result cache holds. The threshold is lowered for these questions: where the default
comes from is bench/semantic_cache.py's business.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import GENERATION_QUEUE
from ragline.broker.redis.keys import Keys

from tests.helpers import Stack, api_key, parse_sse, planted_load, redis_db_after, stack_on_db

pytestmark = pytest.mark.integration

ASKED = "How long may I borrow books from the Vellmar town library?"
CLOSE = "How long can I borrow books from the Vellmar town library?"
ALSO_CLOSE = "For how long may I borrow books from the Vellmar town library?"
FAR = "How often should I oil my bicycle chain?"
THRESHOLD = 0.9
DEPTH_LIMIT = 3


@pytest.fixture(scope="module")
def stack(settings: Settings, test_index: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Three databases after the session's (the next two are other stack tests').
    url = redis_db_after(settings.redis.redis_url, 3, "RAGLINE_TEST_SEMANTIC_REDIS_URL")
    with stack_on_db(
        settings,
        url,
        ("retrieval",),
        tmp_path_factory.mktemp("semantic-logs"),
        auth_enabled=True,
        semantic_cache=True,
        semantic_cache_threshold=THRESHOLD,
        # A RAG request is degraded once the generation queue looks this deep (planted_load).
        max_depth_generation=DEPTH_LIMIT,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def keys(stack: Stack) -> tuple[str, str]:
    return api_key(stack.settings)[0], api_key(stack.settings)[0]


def ask(stack: Stack, key: str, query: str, **extra: Any) -> dict[str, Any]:
    body = {"query": query, "mode": "retrieval", "top_k": 3, **extra}
    reply = httpx.post(f"{stack.base}/v1/query", json=body, headers={"X-API-Key": key}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def remembered(stack: Stack) -> int:
    """Questions remembered so far, over every scope."""
    prefix = Keys(stack.settings.redis.key_prefix).semantic_scope("")
    return int(stack.redis.get(f"{prefix}total") or 0)


def wait_remembered(stack: Stack, count: int) -> None:
    """The API remembers an answer in the background, once its response is out."""
    deadline = time.monotonic() + 5
    while remembered(stack) < count:
        assert time.monotonic() < deadline, f"{remembered(stack)} remembered, not {count}"
        time.sleep(0.05)


def test_a_close_question_of_the_same_key_is_answered_from_the_semantic_cache(
    stack: Stack, keys: tuple[str, str]
) -> None:
    mine, theirs = keys
    first = ask(stack, mine, ASKED)
    assert first["cached"] is False and first["semantic_match"] is None
    assert first["sources"][0]["source"].endswith("library.rst")
    wait_remembered(stack, 1)

    close = ask(stack, mine, CLOSE)
    assert close["cached"] == "semantic"
    assert close["semantic_match"]["question"] == ASKED
    assert THRESHOLD <= close["semantic_match"]["similarity"] < 1.0
    assert close["sources"] == first["sources"] and close["request_id"] != first["request_id"]
    # Its own timings: the lookup's, not the first answer's.
    assert close["timings"]["total_ms"] > 0

    # Asked again, it is still the other question's answer: never stored as its own.
    again = ask(stack, mine, CLOSE)
    assert again["cached"] == "semantic" and again["semantic_match"]["question"] == ASKED

    # Another key's earlier questions never answer: computed, then remembered for that key.
    other = ask(stack, theirs, CLOSE)
    assert other["cached"] is False and other["semantic_match"] is None

    # A question that is not close enough is computed.
    far = ask(stack, mine, FAR)
    assert far["cached"] is False and far["sources"][0]["source"].endswith("bicycle.md")

    # Other options are another scope: the same question with another top_k is computed.
    assert ask(stack, mine, CLOSE, top_k=2)["cached"] is False


def test_a_semantic_hit_is_replayed_as_a_stream(stack: Stack, keys: tuple[str, str]) -> None:
    mine, _ = keys
    ask(stack, mine, ASKED)  # the exact cache's answer, or computed and remembered by now
    wait_remembered(stack, 1)
    with httpx.stream(
        "POST",
        f"{stack.base}/v1/query/stream",
        json={"query": ALSO_CLOSE, "mode": "retrieval", "top_k": 3},
        headers={"X-API-Key": mine},
        timeout=60,
    ) as reply:
        assert reply.status_code == 200, reply.read()
        events = list(parse_sse(reply.iter_lines()))
    assert [name for _, name, _ in events] == ["sources", "done"]
    sources, done = events[0][2], events[1][2]
    assert sources["sources"][0]["source"].endswith("library.rst")
    assert done["cached"] == "semantic" and done["semantic_match"]["question"] == ASKED


def test_a_degraded_answer_is_never_remembered(stack: Stack, keys: tuple[str, str]) -> None:
    _, theirs = keys
    before = remembered(stack)
    with planted_load(stack.settings, GENERATION_QUEUE, DEPTH_LIMIT + 2):
        degraded = ask(stack, theirs, "When does Café Lumière open?", mode="rag")
    assert degraded["degraded"] is True
    time.sleep(0.5)  # what a remembered answer would take, with room to spare
    assert remembered(stack) == before
    # Not remembered: a close question (0.97 with MiniLM) in its scope is computed.
    assert ask(stack, theirs, "When does Café Lumière open up?")["cached"] is False
