"""The cross-cutting middleware on an in-process app over the test Redis: the body limit counts a
chunked body as it arrives (413 on every route that reads one, the app's own answer replaced),
every response carries its request id, and the request counter labels what never reached a
route as refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from ragline.api.app import create_app
from ragline.broker.config.settings import Settings

from tests.helpers import own_prefix

LIMIT = 64 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with own_prefix(settings, "mw") as s, TestClient(create_app(s), base_url="http://localhost") as c:
        yield c


def _chunks(total: int, size: int = 4096) -> Iterator[bytes]:
    yield b'{"query": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream", "/v1/jobs"])
def test_a_chunked_body_past_the_limit_is_413(client: TestClient, path: str) -> None:
    reply = client.post(path, content=_chunks(LIMIT * 3), headers=JSON)
    assert reply.status_code == 413, reply.text
    body = reply.json()
    assert body["error"] == "too_large" and body["request_id"] == reply.headers["x-request-id"]


def test_a_chunked_body_within_the_limit_is_read(client: TestClient) -> None:
    reply = client.post("/v1/query", content=_chunks(LIMIT // 2), headers=JSON)
    assert reply.status_code == 422 and "query is" in reply.json()["message"]  # over max_query_bytes


def test_what_never_reached_a_route_counts_as_refused(client: TestClient) -> None:
    sample = ("ragline_requests_total", {"endpoint": "refused", "status": "413"})
    before = REGISTRY.get_sample_value(*sample) or 0.0
    reply = client.post("/v1/query", content=b"x" * (LIMIT + 1), headers=JSON)
    assert reply.status_code == 413 and reply.headers["x-request-id"]
    assert REGISTRY.get_sample_value(*sample) == before + 1
