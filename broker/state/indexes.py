"""The index registry: which version of each named index is current.

Ingestion writes it after the files are in place; the API reads it to refuse unknown
indexes (404) without loading anything; workers read it to pick up a new version.
"""

from __future__ import annotations

import re
from typing import cast

import redis
import redis.asyncio as aioredis
from ragline.broker.contract.records import IndexInfo
from ragline.broker.errors import RaglineError
from ragline.broker.redis.keys import Keys

# An index name is also a folder name under the index root: nothing that could leave it.
_INDEX_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
INDEX_NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', and not '.' or '..'"


class InvalidIndexName(RaglineError, ValueError):
    """The name breaks :data:`INDEX_NAME_RULE`; the message says so."""


def valid_index_name(name: str) -> bool:
    return _INDEX_NAME.fullmatch(name) is not None and name not in (".", "..")


def check_index_name(name: str) -> str:
    """``name`` when it is a valid index name, else :class:`InvalidIndexName`."""
    if not valid_index_name(name):
        raise InvalidIndexName(f"index name {name!r} is not valid: use {INDEX_NAME_RULE}")
    return name


def register(client: redis.Redis, keys: Keys, info: IndexInfo) -> None:
    client.hset(keys.indexes, info.name, info.encode())


def replace(client: redis.Redis, keys: Keys, info: IndexInfo, *, expected: str | None) -> bool:
    """Register ``info`` only while the registry still names ``expected`` (None: no version), so
    an ingest built on one version never undoes a delete or another ingest made meanwhile."""
    for _ in range(16):  # WATCH covers the whole hash: a change to another index retries
        with client.pipeline() as pipe:
            try:
                pipe.watch(keys.indexes)
                raw = pipe.hget(keys.indexes, info.name)
                current = IndexInfo.decode(raw).version if raw else None
                if current != expected:
                    pipe.unwatch()
                    return False
                pipe.multi()
                pipe.hset(keys.indexes, info.name, info.encode())
                pipe.execute()
                return True
            except redis.WatchError:
                continue
    return False


def unregister(client: redis.Redis, keys: Keys, name: str, *, version: str) -> bool:
    """Remove ``name`` while it is at ``version``; False when it is not (gone, or newer)."""
    current = lookup(client, keys, name)
    if current is None or current.version != version:
        return False
    return bool(client.hdel(keys.indexes, name))


async def aregister(client: aioredis.Redis, keys: Keys, info: IndexInfo) -> None:
    await client.hset(keys.indexes, info.name, info.encode())


async def aunregister(client: aioredis.Redis, keys: Keys, name: str) -> IndexInfo | None:
    """Remove ``name`` from the registry (queries answer 404 from now on); what it named."""
    raw = await client.hget(keys.indexes, name)
    if raw is None:
        return None
    await client.hdel(keys.indexes, name)
    return IndexInfo.decode(raw)


def lookup(client: redis.Redis, keys: Keys, name: str) -> IndexInfo | None:
    raw = client.hget(keys.indexes, name)
    return IndexInfo.decode(raw) if raw else None


async def alookup(client: aioredis.Redis, keys: Keys, name: str) -> IndexInfo | None:
    raw = await client.hget(keys.indexes, name)
    return IndexInfo.decode(raw) if raw else None


def lookup_many(client: redis.Redis, keys: Keys, names: list[str]) -> list[IndexInfo | None]:
    """Each of ``names``' entry (None where there is none), in one round trip."""
    raws = cast(list[bytes | None], client.hmget(keys.indexes, names)) if names else []
    return [IndexInfo.decode(raw) if raw else None for raw in raws]


async def alookup_many(client: aioredis.Redis, keys: Keys, names: list[str]) -> list[IndexInfo | None]:
    """Each of ``names``' entry (None where there is none), in one round trip."""
    raws = await client.hmget(keys.indexes, names) if names else []
    return [IndexInfo.decode(raw) if raw else None for raw in raws]


async def alist(client: aioredis.Redis, keys: Keys) -> list[IndexInfo]:
    raw = await client.hgetall(keys.indexes)
    return [IndexInfo.decode(v) for v in raw.values()]
