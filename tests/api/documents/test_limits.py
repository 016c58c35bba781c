"""An upload's metadata and shard values checked at the door, on an in-process API over the test
Redis (no worker): each refusal is 413 or 422 (409 for shards), names its limit, and stages and
queues nothing. The ingest checks again with the front matter (tests/workers/ingest/test_build.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from ragline.api.app import create_app
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import shards

from tests.helpers import own_prefix

pytestmark = pytest.mark.integration

INDEX = "limits"


@dataclass
class Api:
    client: TestClient
    settings: Settings


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp("limits-home")
    limited = settings.replace(
        home=home,
        metadata_max_keys=4,
        metadata_max_value_chars=16,
        metadata_max_bytes=64,
        max_shards_per_index=3,
    )
    # A name the API answers to (TestClient's own "testserver" is none).
    with own_prefix(limited, INDEX) as s, TestClient(create_app(s), base_url="http://localhost") as c:
        # A sharded index at its limit: three shards of `year`.
        client = redis.Redis.from_url(s.redis.redis_url)
        shard_map = shards.ShardMap(index="years", shard_by="year", keys=("2022", "2023", "2024"))
        info = shards.logical_info(shard_map, [], path=str(home / "years"))
        shards.register(client, Keys(s.redis.key_prefix), shard_map, info)
        yield Api(c, s)


def _json(api: Api, metadata: object, index: str = INDEX) -> tuple[int, str]:
    body = {"documents": [{"id": "faq-7", "text": "Within 30 days.", "metadata": metadata}]}
    reply = api.client.post(f"/v1/indexes/{index}/documents", json=body)
    return reply.status_code, reply.json()["message"]


def _form(api: Api, metadata: str, index: str = INDEX) -> tuple[int, str]:
    files = {"files": ("faq.md", b"# FAQ\n\nWithin 30 days.", "text/markdown")}
    reply = api.client.post(f"/v1/indexes/{index}/documents", files=files, data={"metadata": metadata})
    return reply.status_code, reply.json()["message"]


def _nothing_staged(api: Api) -> bool:
    uploads = Path(api.settings.uploads_dir)
    return not uploads.exists() or not any(uploads.iterdir())


CASES = [
    ({str(i): "v" for i in range(5)}, 422, "RAGLINE_METADATA_MAX_KEYS"),
    ({"team": "x" * 17}, 422, "RAGLINE_METADATA_MAX_VALUE_CHARS"),
    ({"a": "x" * 16, "b": "x" * 16, "c": "x" * 16, "d": "x" * 16}, 413, "RAGLINE_METADATA_MAX_BYTES"),
]


@pytest.mark.parametrize(("metadata", "status", "setting"), CASES)
def test_json_documents_metadata_past_a_limit_is_refused_naming_it(
    api: Api, metadata: dict[str, str], status: int, setting: str
) -> None:
    code, message = _json(api, metadata)
    assert code == status and setting in message and "'faq-7'" in message, message
    assert _nothing_staged(api)


@pytest.mark.parametrize(("metadata", "status", "setting"), CASES)
def test_multipart_metadata_past_a_limit_is_refused_naming_it(
    api: Api, metadata: dict[str, str], status: int, setting: str
) -> None:
    code, message = _form(api, json.dumps(metadata))
    assert code == status and setting in message, message
    assert _nothing_staged(api)


def test_nested_metadata_is_refused_as_past_depth_one(api: Api) -> None:
    code, message = _form(api, '{"team": {"name": "docs"}}')
    assert code == 422 and "depth 1" in message, message
    # Deeper than the JSON parser recurses (a 500 before): past the bytes any metadata within the
    # limits takes, refused unparsed (tests/broker/limits/test_metadata.py: nested within them).
    code, message = _form(api, '{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    assert code == 413 and "RAGLINE_METADATA_MAX_BYTES" in message, message
    code, message = _json(api, {"team": {"name": "docs"}})
    assert code == 422, message  # the body's schema: strings only
    assert _nothing_staged(api)


def test_an_upload_that_would_pass_the_shard_limit_is_refused_naming_it(api: Api) -> None:
    code, message = _json(api, {"year": "2025"}, index="years")
    assert code == 409, message
    assert "'years' would have 4 shards" in message and "RAGLINE_MAX_SHARDS_PER_INDEX" in message
    code, message = _form(api, json.dumps({"year": "2026"}), index="years")
    assert code == 409 and "the limit is 3" in message, message
    assert _nothing_staged(api)
