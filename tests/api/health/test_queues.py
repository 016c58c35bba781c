"""GET /v1/health/queues over HTTP on API processes with keys: admin only, and each queue's depth
as the backpressure monitor measures it (here: tasks planted in kombu's unacked hash, since no
worker runs), with the predicted wait /metrics exports too. The numbers themselves are
admission's (tests/api/pipeline/test_admission.py holds the two to the same predictions)."""

from __future__ import annotations

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from tests.helpers import Api, planted_load

pytestmark = pytest.mark.integration


def _key(settings: Settings, *scopes: str) -> dict[str, str]:
    client = redis.Redis.from_url(settings.redis.redis_url)
    key, _ = apikeys.create(client, Keys(settings.redis.key_prefix), "queues", scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


def test_queue_health_is_for_admin_keys_and_shows_what_admission_sees(
    auth_apis: list[Api], settings: Settings
) -> None:
    base = auth_apis[0].base
    assert httpx.get(base + "/v1/health/queues", timeout=10).status_code == 401
    refused = httpx.get(base + "/v1/health/queues", headers=_key(settings, "read"), timeout=10)
    assert refused.status_code == 403 and "scope admin" in refused.json()["message"]

    admin = _key(settings, "admin")
    with planted_load(settings, "generation", 7):
        reply = httpx.get(base + "/v1/health/queues", headers=admin, timeout=10)
        metrics = httpx.get(base + "/metrics", timeout=10).text
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["admission_enabled"] and body["fresh"] and body["snapshot_age_s"] < 2
    assert body["default_deadline_s"] == settings.api.default_deadline_ms / 1000
    queues = {q["queue"]: q for q in body["queues"]}
    assert {"retrieval", "generation"} <= set(queues)
    generation = queues["generation"]
    assert (generation["depth"], generation["in_flight"], generation["waiting"]) == (7, 7, 0)
    for queue in queues.values():
        assert set(queue) == {
            "queue",
            "depth",
            "waiting",
            "in_flight",
            "not_yet_queued",
            "live_workers",
            "slots",
            "service_rate",
            "task_s",
            "levels",
            "predicted_wait_s",
            "stalled",
        }
        assert queue["predicted_wait_s"] is not None and queue["predicted_wait_s"] >= 0
    assert body["rag_wait_s"] == pytest.approx(
        queues["retrieval"]["predicted_wait_s"] + generation["predicted_wait_s"], abs=0.002
    )
    assert 'ragline_queue_predicted_wait_seconds{queue="generation"}' in metrics
    assert "/v1/health/queues" in httpx.get(base + "/openapi.json", timeout=10).json()["paths"]
