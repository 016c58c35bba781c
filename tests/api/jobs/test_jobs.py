"""Async jobs through the real API, workers and a real local webhook receiver."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from fastapi import Request
from fastapi.testclient import TestClient
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import jobs, webhooks

from tests.helpers import env_for, parse_sse
from tests.webhook_receiver import Receiver, documented_verify, running_receiver

pytestmark = pytest.mark.integration

CAFE_QUESTION = "When does Café Lumière open in the morning?"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def wait_job(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get(f"/v1/jobs/{job_id}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        if body["status"] in statuses or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def wait_delivery(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/jobs/{job_id}").json()
        if (body["webhook"] or {}).get("status") in statuses or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def verify_signature(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The receiver's check, run exactly as docs/webhooks.md prints it."""
    return documented_verify()(secret, httpx.Headers(headers), body)


# -- submit-time checks: the API alone --------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8080/hook",  # resolves to 127.0.0.1 and is not allowlisted
        "http://127.0.0.2/hook",
        "http://10.0.0.7/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://[::ffff:10.0.0.1]/hook",
        "http://100.64.1.1/hook",
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "http://user:pw@93.184.215.14/hook",
    ],
)
def test_ssrf_targets_are_refused_at_submit(client: httpx.Client, test_index: str, url: str) -> None:
    reply = client.post("/v1/jobs", json={"query": "hi", "webhook_url": url})
    assert reply.status_code == 422, reply.text
    body = reply.json()
    assert body["error"] == "invalid_webhook_url" and body["request_id"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [
        ({"query": ""}, {}, 422, "empty"),
        ({"query": "ok", "top_k": 0}, {}, 422, "top_k"),
        ({"query": "ok", "index": "nope"}, {}, 404, "nope"),
        ({"query": "ok", "webhook_url": 5}, {}, 422, "webhook_url"),
        ({"query": "ok", "metadata": "x"}, {}, 422, "metadata"),
        ({"query": "ok", "metadata": {"blob": "x" * 5000}}, {}, 422, "4096"),
        ({"query": "ok", "colour": "red"}, {}, 422, "colour"),
        ({"query": "ok"}, {"Idempotency-Key": "k" * 300}, 422, "Idempotency-Key"),
    ],
)
def test_bad_job_requests(
    client: httpx.Client, test_index: str, body: dict, headers: dict, status: int, needle: str
) -> None:
    reply = client.post("/v1/jobs", json=body, headers=headers)
    assert reply.status_code == status, reply.text
    assert needle in reply.json()["message"]


def test_unknown_jobs_are_404(client: httpx.Client) -> None:
    for path in (f"/v1/jobs/{uuid.uuid4().hex}", "/v1/jobs/..%2Fetc", "/v1/jobs/" + "a" * 80):
        assert client.get(path).status_code == 404
    reply = client.delete(f"/v1/jobs/{uuid.uuid4().hex}")
    assert reply.status_code == 404 and reply.json()["error"] == "not_found"


def test_idempotency_key_returns_the_same_job(client: httpx.Client, test_index: str) -> None:
    key = f"order-{uuid.uuid4()}"
    body = {"query": "How long may I borrow library books?", "mode": "retrieval", "metadata": {"n": 1}}
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == 202, first.text
    again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.headers["Location"] == first.json()["status_url"] == f"/v1/jobs/{first.json()['job_id']}"
    # the same key with a different request is a client bug, not a replay
    other = client.post("/v1/jobs", json={**body, "top_k": 2}, headers={"Idempotency-Key": key})
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    # without the key, or with another one, a new job
    fresh = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key + "-2"})
    assert fresh.json()["job_id"] != first.json()["job_id"]


@pytest.mark.parametrize(
    "change",
    [
        {"filter": {"path": "cafe.md"}},
        {"temperature": 0.7},
        {"history": [{"role": "user", "content": "And on Sundays?"}]},
    ],
    ids=["filter", "temperature", "history"],
)
def test_a_key_reused_with_any_other_field_is_refused(
    client: httpx.Client, test_index: str, change: dict
) -> None:
    """Every field of the request is the request: not only the four the record once kept."""
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    body = {"query": "When does the café open?", "mode": "retrieval"}
    first = client.post("/v1/jobs", json=body, headers=key)
    assert first.status_code == 202, first.text
    other = client.post("/v1/jobs", json={**body, **change}, headers=key)
    assert other.status_code == 422, other.text
    assert other.json()["error"] == "idempotency_key_reused"
    # The same request again is still a replay of the first job.
    again = client.post("/v1/jobs", json=body, headers=key)
    assert again.status_code == 202 and again.json()["job_id"] == first.json()["job_id"]


def test_a_job_shows_its_whole_request(client: httpx.Client, test_index: str, settings: Settings) -> None:
    body = {
        "query": "When does the café open?",
        "mode": "retrieval",
        "filter": {"path": "cafe.md"},
        "temperature": 0.7,
        "history": [{"role": "user", "content": "Hi"}],
    }
    job_id = client.post("/v1/jobs", json=body).json()["job_id"]
    request = client.get(f"/v1/jobs/{job_id}").json()["request"]
    # What the client gave, every other field at its default, and what the job runs where it
    # left that to the server.
    assert {k: request[k] for k in body} == body
    assert request["top_k"] == settings.api.default_top_k and request["index"] == test_index
    assert request["max_tokens"] is None and request["diversity"] is True


def test_a_key_of_a_job_the_previous_release_created(
    client: httpx.Client, test_index: str, settings: Settings
) -> None:
    """Its record keeps four fields of its request: it reads back, but a request cannot be told
    the same as it, so a replay of its key is refused, saying why."""
    keys, r = Keys(settings.redis.key_prefix), redis.Redis.from_url(settings.redis.redis_url)
    job_id, key = uuid.uuid4().hex, f"k-{uuid.uuid4()}"
    request = {"query": "When is the library closed?", "top_k": 5, "mode": "retrieval", "index": test_index}
    digest_of = {**request, "webhook_url": None, "metadata": None}
    now = repr(time.time())
    r.hset(
        keys.job(job_id),
        mapping={
            "id": job_id,
            "owner": "anonymous",
            "status": "queued",
            "created_at": now,
            "updated_at": now,
            "queued_at": now,
            "request": json.dumps(request, separators=(",", ":")),
            "mode": "retrieval",
            "fingerprint": hashlib.sha256(
                json.dumps(digest_of, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest(),
        },
    )
    r.set(keys.idempotency(jobs.idempotency_digest("anonymous", key)), job_id, ex=60)
    try:
        shown = client.get(f"/v1/jobs/{job_id}")
        assert shown.status_code == 200, shown.text
        assert {k: shown.json()["request"][k] for k in request} == request
        again = client.post("/v1/jobs", json=request, headers={"Idempotency-Key": key})
        assert again.status_code == 422 and again.json()["error"] == "idempotency_key_reused"
        assert "earlier release" in again.json()["message"]
    finally:
        r.delete(keys.job(job_id), keys.idempotency(jobs.idempotency_digest("anonymous", key)))


def test_a_key_whose_job_expired_starts_a_new_job(
    client: httpx.Client, test_index: str, settings: Settings
) -> None:
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    body = {"query": "When is the library closed?", "mode": "retrieval"}
    first = client.post("/v1/jobs", json=body, headers=key).json()["job_id"]
    redis.Redis.from_url(settings.redis.redis_url).delete(Keys(settings.redis.key_prefix).job(first))
    again = client.post("/v1/jobs", json=body, headers=key)
    assert again.status_code == 202 and "Idempotent-Replayed" not in again.headers
    assert again.json()["job_id"] != first
    assert client.get(f"/v1/jobs/{first}").status_code == 404


def test_jobs_are_scoped_to_their_principal(settings: Settings, test_index: str) -> None:
    """In-process app whose test middleware plays the API-key layer (it sets request.state.principal)."""
    from ragline.api.app import create_app

    app = create_app(settings)

    @app.middleware("http")
    async def principal_from_header(request: Request, call_next):  # type: ignore[no-untyped-def]
        request.state.principal = request.headers.get("x-test-principal", "anonymous")
        return await call_next(request)

    body = {"query": "When is the library closed?", "mode": "retrieval"}
    with TestClient(app, base_url="http://localhost") as c:  # a name the API answers to
        alice = {"x-test-principal": "alice"}
        bob = {"x-test-principal": "bob"}
        job_id = c.post("/v1/jobs", json=body, headers=alice).json()["job_id"]
        assert c.get(f"/v1/jobs/{job_id}", headers=alice).status_code == 200
        assert c.get(f"/v1/jobs/{job_id}", headers=bob).status_code == 404
        assert c.delete(f"/v1/jobs/{job_id}", headers=bob).status_code == 404
        # its events stream by its id to its owner only; another's and an unknown id: 404 at once
        assert c.get(f"/v1/query/stream/{job_id}", headers=bob).status_code == 404
        assert c.get(f"/v1/query/stream/{uuid.uuid4().hex}", headers=alice).status_code == 404
        # the same Idempotency-Key from two principals names two jobs
        key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
        a = c.post("/v1/jobs", json=body, headers={**alice, **key}).json()["job_id"]
        b = c.post("/v1/jobs", json=body, headers={**bob, **key}).json()["job_id"]
        assert a != b


# -- whole jobs on the real workers -------------------------------------------------------------


@pytest.mark.vllm
def test_rag_job_runs_to_done_and_its_webhook_verifies(
    client: httpx.Client, workers, callbacks_worker, receiver: Receiver, settings: Settings
) -> None:
    url = receiver.url()
    reply = client.post(
        "/v1/jobs",
        json={"query": CAFE_QUESTION, "top_k": 3, "webhook_url": url, "metadata": {"ticket": "T-1"}},
    )
    assert reply.status_code == 202, reply.text
    accepted = reply.json()
    assert accepted["status"] == "queued"
    job_id = accepted["job_id"]

    seen = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.get(accepted["status_url"]).json()
        seen.add(job["status"])
        if job["status"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.02)
    assert job["status"] == "done", job
    assert seen <= {"queued", "retrieving", "generating", "done"}
    assert list(job["timestamps"]) == ["queued", "retrieving", "generating", "done"]
    # The request whole (test_a_job_shows_its_whole_request): these four as they always were.
    asked = {"query": CAFE_QUESTION, "top_k": 3, "mode": "rag", "index": "test"}
    assert {k: job["request"][k] for k in asked} == asked
    assert job["metadata"] == {"ticket": "T-1"}
    result = job["result"]
    # The exact wording is the model's (a 135M model flips near-tied tokens between runs here);
    # what the job must get right is that the answer is the one its events streamed.
    assert result["answer"]
    assert result["sources"][0]["source"].endswith("cafe.md") and len(result["sources"]) == 3
    assert result["usage"]["completion_tokens"] > 0
    assert result["timings"]["total_ms"] >= result["timings"]["generation_ms"] > 0

    (hook,) = receiver.wait(url, 1, timeout=30)
    assert hook.headers["content-type"] == "application/json"
    # Signed with the secret derived for its principal (an API without keys: `anonymous`), which
    # `ragline webhooks secret show anonymous` prints; never with the deployment's own.
    derived = webhooks.derived_secret(settings.webhooks.webhook_secret, "anonymous")
    assert verify_signature(derived, hook.headers, hook.body)
    assert not verify_signature(settings.webhooks.webhook_secret, hook.headers, hook.body)
    assert not verify_signature("wrong-secret", hook.headers, hook.body)
    payload = json.loads(hook.body)
    job = wait_delivery(client, job_id, {"delivered"})
    assert hook.headers["x-ragline-delivery"] == job["webhook"]["delivery_id"]
    assert hook.headers["x-ragline-attempt"] == "1"
    assert payload == {k: v for k, v in job.items() if k != "webhook"}  # the job's final JSON
    assert job["webhook"]["status"] == "delivered" and job["webhook"]["attempts"] == 1
    assert job["webhook"]["last_attempt"]["status_code"] == 200

    # the job's events are the request's events: they can be streamed by its id
    with client.stream("GET", f"/v1/query/stream/{job_id}") as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[0][1] == "sources" and events[-1][1] == "done"
    assert events[-1][2]["answer"] == result["answer"]
    assert "".join(e[2]["text"] for e in events if e[1] == "token") == result["answer"]

    time.sleep(1.0)
    assert len(receiver.received(url)) == 1
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 409  # finished: nothing to cancel


@pytest.mark.vllm
def test_webhook_retries_after_500s_then_delivers(
    client: httpx.Client, workers, callbacks_worker, receiver: Receiver
) -> None:
    url = receiver.url(500, 503)
    job_id = client.post(
        "/v1/jobs",
        json={"query": "How long may I borrow library books?", "mode": "retrieval", "webhook_url": url},
    ).json()["job_id"]
    hooks = receiver.wait(url, 3, timeout=30)
    assert [h.headers["x-ragline-attempt"] for h in hooks] == ["1", "2", "3"]
    assert len({h.headers["x-ragline-delivery"] for h in hooks}) == 1  # one delivery, retried
    assert hooks[1].at - hooks[0].at >= 0.09 and hooks[2].at - hooks[1].at >= 0.19  # backoff
    job = wait_delivery(client, job_id, {"delivered"})
    assert job["status"] == "done" and job["result"]["sources"][0]["source"].endswith("library.rst")
    assert job["webhook"]["status"] == "delivered" and job["webhook"]["attempts"] == 3
    time.sleep(1.0)
    assert len(receiver.received(url)) == 3


@pytest.mark.vllm
def test_webhook_is_dead_lettered_after_the_last_attempt(
    client: httpx.Client, workers, callbacks_worker, receiver: Receiver, settings: Settings
) -> None:
    url = receiver.url(*[500] * 10)
    job_id = client.post(
        "/v1/jobs", json={"query": "When is the library closed?", "mode": "retrieval", "webhook_url": url}
    ).json()["job_id"]
    job = wait_delivery(client, job_id, {"dead"})
    webhook = job["webhook"]
    assert webhook["status"] == "dead" and webhook["attempts"] == settings.webhooks.webhook_max_attempts == 4
    assert webhook["dead_lettered_at"] and webhook["last_attempt"]["status_code"] == 500
    assert len(receiver.received(url)) == 4
    time.sleep(1.5)
    assert len(receiver.received(url)) == 4  # no attempt after the last

    out = subprocess.run(
        [sys.executable, "-m", "ragline", "webhooks", "dead", "--limit", "50"],
        env=env_for(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    entries = [json.loads(line) for line in out.stdout.splitlines()]
    (entry,) = [e for e in entries if e["job_id"] == job_id]
    assert entry["webhook_url"] == url and entry["attempts"] == 4
    assert entry["delivery_id"] == webhook["delivery_id"]


@pytest.mark.vllm
def test_410_stops_delivery(client: httpx.Client, workers, callbacks_worker, receiver: Receiver) -> None:
    url = receiver.url(410)
    job_id = client.post(
        "/v1/jobs", json={"query": "Which platform?", "mode": "retrieval", "webhook_url": url}
    ).json()["job_id"]
    job = wait_delivery(client, job_id, {"gone"})
    assert job["webhook"]["status"] == "gone" and job["webhook"]["attempts"] == 1
    time.sleep(1.0)
    assert len(receiver.received(url)) == 1


@pytest.mark.vllm
def test_per_principal_secret_signs_the_webhook(
    client: httpx.Client, workers, callbacks_worker, receiver: Receiver, settings: Settings
) -> None:
    keys = Keys(settings.redis.key_prefix)
    r = redis.Redis.from_url(settings.redis.redis_url)
    r.set(keys.webhook_secret("anonymous"), "anon-own-secret")
    try:
        url = receiver.url()
        client.post("/v1/jobs", json={"query": "green tea?", "mode": "retrieval", "webhook_url": url})
        (hook,) = receiver.wait(url, 1, timeout=30)
    finally:
        r.delete(keys.webhook_secret("anonymous"))
    assert verify_signature("anon-own-secret", hook.headers, hook.body)
    assert not verify_signature(settings.webhooks.webhook_secret, hook.headers, hook.body)


def test_a_saturated_resolver_is_a_503_not_a_bad_url(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    import asyncio

    import redis.asyncio as aioredis
    from ragline.api.errors import ApiError
    from ragline.api.jobs import service as api_jobs
    from ragline.broker.limits.ssrf import ResolverBusy

    def saturated(*_: object, **__: object) -> None:
        raise ResolverBusy("the DNS resolver is saturated")

    monkeypatch.setattr(api_jobs, "check_url", saturated)  # the one narrow fake: a busy resolver
    client = aioredis.Redis.from_url(redis_url)
    s = Settings()
    service = api_jobs.JobService(s.jobs, s.webhooks, s.redis, redis=client, pipeline=None)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        asyncio.run(service._check_webhook("https://example.com/hook"))
    assert refused.value.status == 503 and "Retry-After" in refused.value.headers
