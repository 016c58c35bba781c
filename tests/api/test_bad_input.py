"""Bad input gets a clear 4xx with a message, never a 500."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"query": ""}, 422, "empty"),
        ({"query": "   \n\t "}, 422, "empty"),
        ({"query": "x" * 4097}, 422, "4096"),
        ({"query": "é" * 2049}, 422, "limit"),  # 4098 bytes of UTF-8
        ({"query": "ok", "top_k": 0}, 422, "top_k"),
        ({"query": "ok", "top_k": 51}, 422, "top_k"),
        ({"query": 123}, 422, "query"),
        ({"query": "ok", "top_k": "5"}, 422, "top_k"),
        ({"query": "ok", "top_k": 2.5}, 422, "top_k"),
        ({"query": "ok", "mode": "poem"}, 422, "mode"),
        ({"query": "ok", "colour": "red"}, 422, "colour"),
        ({}, 422, "query"),
        ([], 422, "body"),
        ({"query": "ok", "index": "no-such-index"}, 404, "no-such-index"),
        ({"query": "ok", "index": "../etc"}, 422, "index"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream"])
def test_bad_bodies(
    client: httpx.Client, test_index: str, path: str, body: object, status: int, needle: str
) -> None:
    reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    payload = reply.json()
    assert needle in payload["message"]
    assert payload["error"] and payload["request_id"]


@pytest.mark.parametrize("raw", [b"{not json", b'{"query": "x"', b"\xff\xfe"])
def test_malformed_json_is_400(client: httpx.Client, raw: bytes) -> None:
    reply = client.post("/v1/query", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert "JSON" in reply.json()["message"]


def test_oversized_body_is_413(client: httpx.Client) -> None:
    reply = client.post("/v1/query", json={"query": "x" * 100_000})
    assert reply.status_code == 413


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert client.get("/v1/nope").status_code == 404
    assert client.get("/v1/query").status_code == 405
