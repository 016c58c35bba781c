"""The door on real API processes with keys on: 401, 429 across two processes, 503 and degraded
answers under (planted) load, none of which touches a queue, and X-Request-Id everywhere."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from ragline.broker.config.settings import Settings

from tests.helpers import Api, api_key, env_for, parse_sse, planted_load, pushed_queues

pytestmark = pytest.mark.integration


def test_keys_are_required_except_on_probes_metrics_and_docs(
    auth_apis: list[Api], settings: Settings
) -> None:
    base = auth_apis[0].base
    for path in ("/healthz", "/metrics", "/openapi.json", "/docs"):
        reply = httpx.get(base + path, timeout=10)
        assert reply.status_code == 200, path
        assert reply.headers["X-Request-Id"]
    assert httpx.get(base + "/readyz", timeout=10).status_code in (200, 503)  # no 401

    key, key_id = api_key(settings)
    body = {"query": "x", "index": "no-such-index"}
    with pushed_queues(settings.redis.redis_url) as pushed:
        missing = httpx.post(base + "/v1/query", json=body, timeout=10)
        wrong = httpx.post(base + "/v1/query", json=body, headers={"X-API-Key": "rl_guess"}, timeout=10)
        basic = httpx.post(base + "/v1/query", json=body, headers={"Authorization": "Basic eDp5"}, timeout=10)
        stream = httpx.post(base + "/v1/query/stream", json=body, timeout=10)
    for reply in (missing, wrong, basic, stream):
        assert reply.status_code == 401, reply.text
        assert reply.headers["WWW-Authenticate"] == "Bearer"
        assert reply.json()["error"] == "unauthenticated"
        assert reply.headers["X-Request-Id"] == reply.json()["request_id"]
    assert pushed == []

    for headers in ({"Authorization": f"Bearer {key}"}, {"X-API-Key": key}):
        reply = httpx.post(base + "/v1/query", json=body, headers=headers, timeout=10)
        assert reply.status_code == 404, reply.text  # past the door: the index is unknown
        assert reply.headers["X-RateLimit-Limit"] == "1000"

    subprocess.run(
        [sys.executable, "-m", "ragline", "keys", "revoke", key_id],
        env=env_for(settings),
        check=True,
        timeout=60,
    )
    reply = httpx.post(base + "/v1/query", json=body, headers={"X-API-Key": key}, timeout=10)
    assert reply.status_code == 401 and "revoked" in reply.json()["message"]


def test_token_bucket_holds_across_two_api_processes(auth_apis: list[Api], settings: Settings) -> None:
    key, _ = api_key(settings, rate=0.05, burst=5)  # 5 now, then one per 20 s
    body = {"query": "x", "index": "no-such-index"}
    with pushed_queues(settings.redis.redis_url) as pushed:
        replies = [
            httpx.post(auth_apis[i % 2].base + "/v1/query", json=body, headers={"X-API-Key": key}, timeout=10)
            for i in range(10)
        ]
    assert [r.status_code for r in replies] == [404] * 5 + [429] * 5
    assert [r.headers["X-RateLimit-Remaining"] for r in replies[:5]] == ["4", "3", "2", "1", "0"]
    for reply in replies[5:]:
        assert reply.json()["error"] == "rate_limited"
        assert 1 <= int(reply.headers["Retry-After"]) <= 20
        assert reply.headers["X-RateLimit-Limit"] == "5"
        assert reply.headers["X-RateLimit-Remaining"] == "0"
        assert reply.headers["X-Request-Id"] == reply.json()["request_id"]
    assert pushed == []
    metrics = httpx.get(auth_apis[1].base + "/metrics", timeout=10).text
    assert re.search(r'ragline_rejections_total\{reason="rate_limited"\} [1-9]', metrics)


@pytest.mark.vllm
def test_overload_refuses_with_retry_after_and_touches_no_queue(
    auth_apis: list[Api], workers, settings: Settings
) -> None:
    base = auth_apis[0].base
    headers = {"X-API-Key": api_key(settings)[0]}
    with planted_load(settings, "retrieval"), pushed_queues(settings.redis.redis_url) as pushed:
        replies = [
            httpx.post(
                base + "/v1/query", json={"query": f"overload {uuid.uuid4()}"}, headers=headers, timeout=30
            ),
            httpx.post(
                base + "/v1/query",
                json={"query": f"overload {uuid.uuid4()}", "mode": "retrieval"},
                headers=headers,
                timeout=30,
            ),
            httpx.post(
                base + "/v1/query/stream",
                json={"query": f"overload {uuid.uuid4()}"},
                headers=headers,
                timeout=30,
            ),
        ]
    for reply in replies:
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"] == "overloaded"
        assert int(reply.headers["Retry-After"]) >= 1
        assert reply.headers["X-Request-Id"] == reply.json()["request_id"]
    assert pushed == []
    metrics = httpx.get(base + "/metrics", timeout=10).text
    assert re.search(r'ragline_rejections_total\{reason="overloaded"\} [1-9]', metrics)


@pytest.mark.vllm
def test_busy_generation_degrades_to_retrieval_only(
    auth_apis: list[Api], workers, settings: Settings
) -> None:
    base = auth_apis[1].base
    headers = {"X-API-Key": api_key(settings)[0]}
    query = "When does Café Lumière open? (degraded)"
    with planted_load(settings, "generation"), pushed_queues(settings.redis.redis_url) as pushed:
        degraded = httpx.post(
            base + "/v1/query", json={"query": query, "top_k": 2}, headers=headers, timeout=60
        )
        refused = httpx.post(
            base + "/v1/query",
            json={"query": query + " strict", "allow_degraded": False},
            headers=headers,
            timeout=60,
        )
        with httpx.stream(
            "POST",
            base + "/v1/query/stream",
            json={"query": query + " streamed"},
            headers=headers,
            timeout=60,
        ) as r:
            assert r.status_code == 200
            events = list(parse_sse(r.iter_lines()))
    assert degraded.status_code == 200, degraded.text
    body = degraded.json()
    assert body["degraded"] is True and body["degraded_reason"] == "generation_queue_full"
    assert "Generation is busy" in body["notice"]
    assert body["answer"] is None and body["sources"][0]["source"].endswith("cafe.md")
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert [e[1] for e in events] == ["sources", "done"]
    assert events[-1][2]["degraded"] is True and events[-1][2]["notice"]
    assert "retrieval" in pushed and "generation" not in pushed
    # Once generation has room again, the same question gets a generated answer (not the
    # degraded one from the cache).
    time.sleep(0.3)
    full = httpx.post(base + "/v1/query", json={"query": query, "top_k": 2}, headers=headers, timeout=180)
    assert full.status_code == 200 and full.json()["degraded"] is False and full.json()["answer"]


@pytest.mark.vllm
def test_every_response_carries_a_request_id(auth_apis: list[Api], workers, settings: Settings) -> None:
    base = auth_apis[0].base
    headers = {"X-API-Key": api_key(settings, rate=1000, burst=1000)[0]}
    limited = {"X-API-Key": api_key(settings, rate=0.01, burst=1)[0]}
    replies = [
        httpx.get(base + "/healthz"),
        httpx.get(base + "/metrics"),
        httpx.get(base + "/v1/nope", headers=headers),  # 404
        httpx.get(base + "/v1/query", headers=headers),  # 405
        httpx.post(
            base + "/v1/query", content=b"{bad", headers={**headers, "content-type": "application/json"}
        ),
        httpx.post(base + "/v1/query", json={"query": ""}, headers=headers),  # 422
        httpx.post(base + "/v1/query", json={"query": "x" * 100_000}, headers=headers),  # 413
        httpx.post(base + "/v1/query", json={"query": "x"}),  # 401
        httpx.post(base + "/v1/query", json={"query": "x", "index": "none"}, headers=limited),  # 404
        httpx.post(base + "/v1/query", json={"query": "x", "index": "none"}, headers=limited),  # 429
        httpx.post(
            base + "/v1/query",
            json={"query": f"Which day is the library closed? ({uuid.uuid4().hex[:6]})", "mode": "retrieval"},
            headers=headers,
            timeout=60,
        ),
    ]
    statuses = [r.status_code for r in replies]
    assert statuses == [200, 200, 404, 405, 400, 422, 413, 401, 404, 429, 200], statuses
    ids = [r.headers.get("X-Request-Id") for r in replies]
    assert all(ids) and len(set(ids)) == len(ids)


def test_keys_cli_create_list_revoke(settings: Settings, redis_url: str) -> None:
    env = env_for(settings.replace(key_prefix=f"ragline-test-{uuid.uuid4().hex[:8]}"))

    def ragline(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ragline", "keys", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = ragline("create", "--name", "ci bot", "--rate", "2.5", "--burst", "9")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()  # stdout is the key alone: KEY=$(ragline keys create ...)
    key_id = re.search(r"created (key_[0-9a-f]+)", created.stderr).group(1)  # type: ignore[union-attr]
    assert key.startswith("rl_") and "rate 2.5/s, burst 9" in created.stderr

    listed = ragline("list")
    assert listed.returncode == 0 and key_id in listed.stdout and "ci bot" in listed.stdout
    assert key not in listed.stdout and "active" in listed.stdout

    assert ragline("revoke", key_id).returncode == 0
    assert "revoked" in ragline("list").stdout
    missing = ragline("revoke", "key_000000000000")
    assert missing.returncode == 1 and "no key" in missing.stderr
