"""A sharded index is one index to its callers: its shards (``NAME.shard-KEY``, ordinary entries
in the registry) cannot be queried, asked for as a model, or listed as one; the sharded index is
listed once. An in-process app on the test Redis, the sharded index registered without files
(nothing is searched: every refusal comes before a worker would be asked)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from ragline.api.app import create_app
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards

from tests.helpers import own_prefix

SHARD = "split.shard-0"


@pytest.fixture(scope="module")
def app(settings: Settings) -> Iterator[TestClient]:
    with own_prefix(settings, "plain") as s:
        client, keys = redis.Redis.from_url(s.redis.redis_url), Keys(s.redis.key_prefix)
        shard_map = shards.ShardMap(index="split", shard_by=None, keys=("0", "1"), count=2)
        parts = [
            indexes.IndexInfo(name=name, version="v1", path="/nowhere", chunks=3, dim=384)
            for name in shard_map.shards
        ]
        for info in parts:
            indexes.register(client, keys, info)
        shards.register(client, keys, shard_map, shards.logical_info(shard_map, parts, path="/nowhere"))
        # A name the API answers to (TestClient's own "testserver" is none).
        with TestClient(create_app(s), base_url="http://localhost") as c:
            yield c


@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream", "/v1/jobs"])
def test_a_query_naming_a_shard_is_refused(app: TestClient, path: str) -> None:
    reply = app.post(path, json={"query": "anything", "index": SHARD, "mode": "retrieval"})
    assert reply.status_code == 404, reply.text
    body = reply.json()
    assert body["error"] == "unknown_index"
    assert SHARD in body["message"] and "'split'" in body["message"]


def test_a_chat_completion_naming_a_shard_is_refused(app: TestClient) -> None:
    reply = app.post(
        "/v1/chat/completions", json={"model": SHARD, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"]["code"] == "model_not_found"


def test_models_list_the_sharded_index_once_and_no_shard(app: TestClient) -> None:
    ids = [m["id"] for m in app.get("/v1/models").json()["data"]]
    assert ids.count("split") == 1 and "plain" in ids
    assert not [i for i in ids if shards.split_shard(i)], ids
    assert app.get(f"/v1/models/{SHARD}").status_code == 404
    assert app.get("/v1/models/split").status_code == 200


def test_indexes_list_the_sharded_index_once_and_no_shard(app: TestClient) -> None:
    listed = app.get("/v1/indexes").json()["indexes"]
    names = [i["name"] for i in listed]
    assert names.count("split") == 1 and not [n for n in names if shards.split_shard(n)], names
    assert next(i for i in listed if i["name"] == "split")["shards"] == 2
    # One shard's own entry is still there for an operator, naming what it is part of.
    assert app.get(f"/v1/indexes/{SHARD}").json()["shard_of"] == "split"
