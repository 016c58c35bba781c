"""Per-key caps on real API processes (keys on, no workers): a key at its cap of open streams,
waiting requests or unfinished jobs gets 429 ``key_cap`` with Retry-After while another key is
still served; what it held is let go when it ends; cache hits are never capped.

Nothing here needs a worker: a resumed stream whose request never finishes, or a query no worker
takes, waits (holding its lease) as a real one does under load, until it ends or its client goes.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import RETRIEVAL_QUEUE
from ragline.broker.limits.leases import REQUESTS
from ragline.broker.redis.keys import Keys

from tests.helpers import Api, api_key, own_prefix, result_cache_key, start_api

pytestmark = pytest.mark.integration

CAP = 2
CACHED = {
    "answer": "It opens at 7:15.",
    "usage": {"prompt_tokens": 12, "completion_tokens": 6},
    "timings": {"queue_ms": 1.0, "retrieval_ms": 2.0, "generation_ms": 30.0, "total_ms": 40.0},
    "sources": [],
    "cached": True,
}
HIT = {"query": "When does the café open?"}


@pytest.fixture(scope="module")
def capped(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, list[Api]]]:
    """Two API processes with keys on and small caps, under a key prefix (and index) of their own;
    a cached answer planted for ``HIT``. The tasks their queries leave on the (shared) retrieval
    queue are removed afterwards: no worker of a later test takes them."""
    index = f"caps-{uuid.uuid4().hex[:6]}"
    with own_prefix(settings, index) as own, _queue_left_as_found(settings.redis.redis_url):
        s = own.replace(
            auth_enabled=True,
            admission_enabled=False,  # no workers here: admission would refuse every miss
            key_max_requests=CAP,
            key_max_streams=CAP,
            key_max_unfinished_jobs=CAP,
            request_timeout_s=10.0,
        )
        _plant(s, HIT)
        logs = tmp_path_factory.mktemp("caps-api-logs")
        apis = [start_api(s, logs / f"api-{i}.log") for i in range(2)]
        try:
            yield s, apis
        finally:
            for started in apis:
                started.proc.stop()


def _plant(s: Settings, body: dict[str, str]) -> None:
    redis.Redis.from_url(s.redis.redis_url).set(result_cache_key(s, body), json.dumps(CACHED))


@contextlib.contextmanager
def _queue_left_as_found(url: str) -> Iterator[None]:
    client = redis.Redis.from_url(url)
    before = set(client.lrange(RETRIEVAL_QUEUE, 0, -1))
    try:
        yield
    finally:
        for message in set(client.lrange(RETRIEVAL_QUEUE, 0, -1)) - before:
            client.lrem(RETRIEVAL_QUEUE, 0, message)


def _owned_streams(s: Settings, owner: str, n: int) -> list[str]:
    """Request ids whose streams ``owner`` may resume (as after its own POST /v1/query/stream);
    no event ever comes on them, so a resume waits until the request timeout."""
    client, keys = redis.Redis.from_url(s.redis.redis_url), Keys(s.redis.key_prefix)
    ids = [uuid.uuid4().hex for _ in range(n)]
    for request_id in ids:
        client.set(keys.stream_owner(request_id), owner, ex=600)
    return ids


def _refused(reply: httpx.Response, cap_name: str) -> None:
    assert reply.status_code == 429, reply.text
    assert reply.headers["Retry-After"] == "1"
    body = reply.json()
    error = body["error"] if isinstance(body["error"], dict) else body  # OpenAI's shape on /v1/chat
    assert (error.get("code") or error["error"]) == "key_cap" and cap_name in error["message"]


def test_a_key_at_its_stream_cap_gets_429_while_another_key_streams_and_a_closed_stream_frees_one(
    capped: tuple[Settings, list[Api]],
) -> None:
    s, apis = capped
    (key_a, id_a), (key_b, id_b) = api_key(s), api_key(s)
    a_ids, b_ids = _owned_streams(s, id_a, CAP + 1), _owned_streams(s, id_b, 1)
    auth_a, auth_b = {"X-API-Key": key_a}, {"X-API-Key": key_b}
    held: list[contextlib.ExitStack] = []
    with httpx.Client(timeout=30) as client:
        # Key A's streams on both processes: the cap is the key's, wherever its streams are.
        for i, request_id in enumerate(a_ids[:CAP]):
            held.append(contextlib.ExitStack())
            url = f"{apis[i % 2].base}/v1/query/stream/{request_id}"
            assert held[-1].enter_context(client.stream("GET", url, headers=auth_a)).status_code == 200
        for api in apis:
            _refused(
                client.get(f"{api.base}/v1/query/stream/{a_ids[CAP]}", headers=auth_a), "key_max_streams"
            )
            # A chat stream's resume counts as one of the key's streams too.
            chat = client.get(f"{api.base}/v1/chat/completions/chatcmpl-{a_ids[CAP]}/stream", headers=auth_a)
            _refused(chat, "key_max_streams")
            # A new stream (POST) too: refused before it is enqueued.
            _refused(
                client.post(f"{api.base}/v1/query/stream", json={"query": "new?"}, headers=auth_a),
                "key_max_streams",
            )
        with client.stream("GET", f"{apis[0].base}/v1/query/stream/{b_ids[0]}", headers=auth_b) as other:
            assert other.status_code == 200  # key B is not held up by key A
        # The client closes one of its streams: the API notices, and its slot is free again.
        held.pop(0).close()
        deadline = time.monotonic() + 5
        while True:
            with client.stream(
                "GET", f"{apis[1].base}/v1/query/stream/{a_ids[CAP]}", headers=auth_a
            ) as again:
                if again.status_code == 200:
                    break
                assert again.status_code == 429 and time.monotonic() < deadline, "the closed stream's slot"
            time.sleep(0.2)
        for stream in held:
            stream.close()


def test_a_key_at_its_request_cap_gets_429_cache_hits_still_answer_and_an_ended_request_frees_one(
    capped: tuple[Settings, list[Api]],
) -> None:
    s, apis = capped
    (key_a, id_a), (key_b, _) = api_key(s), api_key(s)
    auth_a, auth_b = {"X-API-Key": key_a}, {"X-API-Key": key_b}

    def ask(api: Api, headers: dict[str, str], query: str, timeout: float = 30) -> httpx.Response:
        return httpx.post(f"{api.base}/v1/query", json={"query": query}, headers=headers, timeout=timeout)

    with cf.ThreadPoolExecutor(CAP) as pool:
        # No worker answers these: they wait, holding the key's requests, until the request timeout.
        waiting = [
            pool.submit(ask, apis[i % 2], auth_a, f"question {i} {uuid.uuid4().hex}") for i in range(CAP)
        ]
        _wait_held(s, Keys(s.redis.key_prefix).leases(REQUESTS, id_a), CAP)
        for api in apis:
            _refused(ask(api, auth_a, f"one more {uuid.uuid4().hex}"), "key_max_requests")
            # The chat endpoint's non-stream answers are requests of the same pipeline.
            chat = httpx.post(
                f"{api.base}/v1/chat/completions",
                json={"model": s.retrieval.default_index, "messages": [{"role": "user", "content": "hi?"}]},
                headers=auth_a,
                timeout=30,
            )
            _refused(chat, "key_max_requests")
            # A cache hit holds nothing, so it is answered at the cap.
            hit = ask(api, auth_a, HIT["query"])
            assert hit.status_code == 200 and hit.json()["cached"] is True, hit.text
        # Key B's miss is admitted: it waits (the client gives up first), it is not refused.
        with pytest.raises(httpx.ReadTimeout):
            ask(apis[0], auth_b, f"key b {uuid.uuid4().hex}", timeout=1.5)
        assert [f.result().status_code for f in waiting] == [504] * CAP  # ended: no answer in time
    # Ended, they let their leases go: key A's next miss is admitted again.
    with pytest.raises(httpx.ReadTimeout):
        ask(apis[1], auth_a, f"after {uuid.uuid4().hex}", timeout=1.5)


def test_a_key_past_its_unfinished_jobs_gets_429_until_one_finishes(
    capped: tuple[Settings, list[Api]],
) -> None:
    s, apis = capped
    (key_a, _), (key_b, _) = api_key(s), api_key(s)
    auth_a, auth_b = {"X-API-Key": key_a}, {"X-API-Key": key_b}

    def submit(api: Api, headers: dict[str, str], **extra: str) -> httpx.Response:
        body = {"query": f"job {uuid.uuid4().hex}"}
        return httpx.post(f"{api.base}/v1/jobs", json=body, headers={**headers, **extra}, timeout=30)

    accepted = [submit(apis[i % 2], auth_a, **{"Idempotency-Key": f"k{i}"}) for i in range(CAP)]
    assert [r.status_code for r in accepted] == [202] * CAP  # queued: no worker takes them
    for api in apis:
        _refused(submit(api, auth_a), "key_max_unfinished_jobs")
    assert submit(apis[0], auth_b).status_code == 202
    # A replay of a known Idempotency-Key is its job, not a new one: answered at the cap.
    replay = httpx.post(
        f"{apis[1].base}/v1/jobs",
        json=json.loads(accepted[0].request.content),
        headers={**auth_a, "Idempotency-Key": "k0"},
        timeout=30,
    )
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    # One finishes (cancelled): its slot is free.
    job_id = accepted[0].json()["job_id"]
    assert httpx.delete(f"{apis[0].base}/v1/jobs/{job_id}", headers=auth_a, timeout=30).status_code == 200
    assert submit(apis[1], auth_a).status_code == 202
    _refused(submit(apis[0], auth_a), "key_max_unfinished_jobs")


def _wait_held(s: Settings, lease_key: str, n: int, timeout: float = 10) -> None:
    client, deadline = redis.Redis.from_url(s.redis.redis_url), time.monotonic() + timeout
    while client.zcard(lease_key) < n:
        assert time.monotonic() < deadline, f"{lease_key} never held {n} leases"
        time.sleep(0.05)
