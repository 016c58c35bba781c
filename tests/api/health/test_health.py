"""Liveness, readiness (turns not-ready when workers stop), and docs."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.helpers import wait_for_workers

pytestmark = pytest.mark.integration


def test_healthz_and_docs(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/query" in spec["paths"] and "/v1/query/stream" in spec["paths"]


def _wait_status(client: httpx.Client, status: int, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get("/readyz")
        if reply.status_code == status or time.monotonic() > deadline:
            return reply
        time.sleep(0.2)


@pytest.mark.vllm
def test_readyz_turns_not_ready_when_a_worker_stops(client: httpx.Client, workers) -> None:
    started = time.perf_counter()
    reply = client.get("/readyz")
    assert (time.perf_counter() - started) < 0.5
    assert reply.status_code == 200, reply.text
    assert reply.json()["workers"]["retrieval"] >= 1

    workers.retrieval.stop()
    reply = _wait_status(client, 503, timeout=10)
    assert reply.status_code == 503
    assert "retrieval" in reply.json()["reason"]

    workers.retrieval.start()
    wait_for_workers(workers.settings, ("retrieval",), [workers.retrieval], timeout=120)
    assert _wait_status(client, 200, timeout=10).status_code == 200


def test_metrics_endpoint_exports_request_and_worker_gauges(client: httpx.Client, workers) -> None:
    client.post("/v1/query", json={"query": "When is the library closed?", "mode": "retrieval"})
    text = client.get("/metrics").text
    assert 'ragline_requests_total{endpoint="/v1/query",status="200"}' in text
    assert 'ragline_request_seconds_bucket{endpoint="/v1/query",le="0.001",mode="retrieval"}' in text
    assert 'ragline_live_workers{queue="retrieval"} 1.0' in text
    assert 'ragline_cache_misses_total{level="result"}' in text
