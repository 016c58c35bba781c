"""The index registry: which version of each named index is current.

Ingestion writes it after the files are in place; the API reads it to refuse unknown
indexes (404) without loading anything; workers read it to pick up a new version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import redis
import redis.asyncio as aioredis

from broker.keys import Keys


@dataclass(frozen=True, slots=True)
class IndexInfo:
    name: str
    version: str
    path: str
    chunks: int
    dim: int
    index_type: str = "hnsw"
    # Recorded at ingest; None for a version ingested before they were (its registry entry or
    # meta.json lacks them).
    documents: int | None = None
    bytes: int | None = None  # the version's files on disk: vectors and chunks


def register(client: redis.Redis, keys: Keys, info: IndexInfo) -> None:
    client.hset(keys.indexes, info.name, json.dumps(asdict(info)))


def lookup(client: redis.Redis, keys: Keys, name: str) -> IndexInfo | None:
    raw = client.hget(keys.indexes, name)
    return IndexInfo(**json.loads(raw)) if raw else None


async def alookup(client: aioredis.Redis, keys: Keys, name: str) -> IndexInfo | None:
    raw = await client.hget(keys.indexes, name)
    return IndexInfo(**json.loads(raw)) if raw else None


async def alist(client: aioredis.Redis, keys: Keys) -> list[IndexInfo]:
    raw = await client.hgetall(keys.indexes)
    return [IndexInfo(**json.loads(v)) for v in raw.values()]
