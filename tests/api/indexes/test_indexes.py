"""GET /v1/indexes and GET /v1/indexes/{name} on a real API, from what ingest registered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import indexes

from ragline.client import Client, NotFound
from tests.helpers import FILLER_DOCS, Api

pytestmark = pytest.mark.integration


def test_indexes_show_what_ingest_recorded(api: Api, test_index: str, settings: Settings) -> None:
    with Client(api.base) as client:
        listed = client.indexes()
        detail = client.index(test_index)
    info = indexes.lookup(sync_client(settings.redis), Keys(settings.redis.key_prefix), test_index)
    assert info is not None
    assert listed.default_index == test_index
    summary = next(ix for ix in listed.indexes if ix.name == test_index)
    assert summary.default
    assert summary.documents == detail.documents == 1 + len(FILLER_DOCS)
    assert summary.version == detail.version == info.version
    assert summary.chunks == detail.chunks == info.chunks > 0
    folder = Path(info.path)
    # Every file of the version: vectors, chunks and the lexical index's folder.
    on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "meta.json")
    assert detail.bytes == on_disk > 0
    assert (detail.index_type, detail.dim) == ("hnsw", 384)
    # The version's meta.json carries them too: a worker re-registers from it after a Redis loss.
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["documents"], meta["bytes"]) == (detail.documents, detail.bytes)


def test_unknown_index_is_404(api: Api) -> None:
    with Client(api.base, retries=0) as client, pytest.raises(NotFound) as missing:
        client.index("no-such-index")
    assert missing.value.error == "unknown_index"
    assert "no-such-index" in missing.value.message


def test_an_index_registered_before_the_counts_shows_them_as_null(api: Api, settings: Settings) -> None:
    store = sync_client(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    # An entry as ingest wrote it before documents and bytes were recorded.
    old = {
        "name": "legacy",
        "version": "v1",
        "path": "/nowhere",
        "chunks": 12,
        "dim": 384,
        "index_type": "hnsw",
    }
    store.hset(keys.indexes, "legacy", json.dumps(old))
    try:
        with Client(api.base) as client:
            listed = client.indexes()
            detail = client.index("legacy")
    finally:
        store.hdel(keys.indexes, "legacy")
    assert [ix.name for ix in listed.indexes] == sorted(ix.name for ix in listed.indexes)
    assert next(ix for ix in listed.indexes if ix.name == "legacy").documents is None
    assert (detail.chunks, detail.documents, detail.bytes, detail.default) == (12, None, None, False)
