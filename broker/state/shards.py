"""Sharded indexes: one logical index made of several ordinary ones, searched together.

Each shard is an index of its own (stored, versioned and swapped like any other, see
``workers/retrieval/index_files.py``) named ``<index>.shard-<key>``: the key is the shard's number
(hash of the document id) or its value of the shard field. The name keeps the index-name rule,
so a shard is a folder under the index root like any index. The logical index has two records:

- its :class:`ShardMap` in ``Keys.shard_maps``: the shard field (None: by hash, with the count
  the hash spreads over) and the keys;
- an entry in the index registry whose ``index_type`` is ``sharded`` and whose version changes
  whenever one of its shards does, so the API's 404s, its index list and its result-cache keys
  treat it as any index, and a re-ingest of one shard invalidates cached answers.

Each shard is served from its own Celery queue, ``retrieval.<shard index>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import MetadataFilter, PrefixMatch
from ragline.broker.contract.queues import RETRIEVAL_QUEUE
from ragline.broker.contract.records import IndexInfo, ShardMapRecord
from ragline.broker.errors import RaglineError
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes
from ragline.broker.state.indexes import InvalidIndexName

SHARD_MARK = ".shard-"
SHARDED_TYPE = "sharded"
# `RAGLINE_WORKER_SHARDS`: what a retrieval worker holds and serves.
ALL_SHARDS = "all"
NO_SHARDS = "none"


def shard_index(index: str, key: str) -> str:
    """The index name of ``index``'s shard ``key``; InvalidIndexName when it breaks the rule."""
    if not key:
        raise InvalidIndexName(f"a shard of {index!r} needs a key (a number, or its field's value)")
    return indexes.check_index_name(f"{index}{SHARD_MARK}{key}")


def split_shard(name: str) -> tuple[str, str] | None:
    """(logical index, key) for a shard's index name; None for any other index."""
    index, mark, key = name.partition(SHARD_MARK)
    return (index, key) if mark and index and key else None


def check_logical_name(name: str) -> str:
    """A name a sharded (or plain) index may be ingested under: the index-name rule, and not a
    shard's name, which would collide with one."""
    indexes.check_index_name(name)
    if SHARD_MARK in name:
        raise InvalidIndexName(f"index name {name!r} is not valid: {SHARD_MARK!r} is kept for shards")
    return name


def shard_queue(shard: str) -> str:
    """The Celery queue serving one shard (by its index name)."""
    return f"{RETRIEVAL_QUEUE}.{shard}"


class TooManyShards(RaglineError, ValueError):
    """An ingest or upload that would give an index more shards than RAGLINE_MAX_SHARDS_PER_INDEX."""


def check_shard_count(index: str, known: Iterable[str], adding: Iterable[str], *, limit: int) -> None:
    """TooManyShards when ``index``, holding the shards ``known``, would pass ``limit`` with the
    keys ``adding`` (those it holds already count once): each shard is a queue, a heartbeat and
    an index that default workers load."""
    have = set(known)
    new = sorted(set(adding) - have)
    if len(have) + len(new) <= limit:
        return
    named = ", ".join(repr(k[:40]) for k in new[:5]) + (", ..." if len(new) > 5 else "")
    raise TooManyShards(
        f"index {index!r} would have {len(have) + len(new)} shards ({len(have)} now, new: {named}); "
        f"the limit is {limit} (RAGLINE_MAX_SHARDS_PER_INDEX)"
    )


def hash_shard(document_id: str, count: int) -> str:
    """The shard a document goes to when sharded by hash: stable across processes and releases."""
    digest = hashlib.blake2b(document_id.encode(), digest_size=8).digest()
    return str(int.from_bytes(digest, "big") % count)


class ShardMap(ShardMapRecord):
    """A sharded index's map (its record, see :class:`ShardMapRecord`) and how queries are routed by it."""

    @property
    def shards(self) -> tuple[str, ...]:
        """Every shard's index name, in key order."""
        return tuple(shard_index(self.index, k) for k in self.keys)

    def route(self, flt: MetadataFilter | None) -> tuple[str, ...]:
        """The shards a query with ``flt`` may find anything in: those its filter on the shard
        field allows, or every one."""
        wanted = (flt or {}).get(self.shard_by) if self.shard_by else None
        if wanted is None:
            return self.shards
        if isinstance(wanted, PrefixMatch):
            keys = [k for k in self.keys if k.startswith(wanted.prefix)]
        elif isinstance(wanted, list):
            keys = [k for k in self.keys if k in wanted]
        else:
            keys = [k for k in self.keys if k == wanted]
        return tuple(shard_index(self.index, k) for k in keys)


def logical_info(shard_map: ShardMap, shards: Iterable[IndexInfo], *, path: str) -> IndexInfo:
    """The logical index's registry entry: its version names every shard's version."""
    found = sorted(shards, key=lambda s: s.name)
    versions = ",".join(f"{s.name}={s.version}" for s in found)
    documents = [s.documents for s in found]
    sizes = [s.bytes for s in found]
    return IndexInfo(
        name=shard_map.index,
        version="shards-" + hashlib.sha256(versions.encode()).hexdigest()[:16],
        path=path,
        chunks=sum(s.chunks for s in found),
        dim=found[0].dim if found else 0,
        index_type=SHARDED_TYPE,
        documents=None if None in documents else sum(d for d in documents if d is not None),
        bytes=None if None in sizes else sum(b for b in sizes if b is not None),
    )


def register(client: redis.Redis, keys: Keys, shard_map: ShardMap, info: IndexInfo) -> None:
    """The map and the logical entry together, so no reader sees one without the other."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.shard_maps, shard_map.index, shard_map.encode())
        pipe.hset(keys.indexes, info.name, info.encode())
        pipe.execute()


def unregister(client: redis.Redis, keys: Keys, shard_map: ShardMap) -> None:
    """The map, every shard's entry and the logical one, together: no reader sees shards without
    their map, or a map without its shards."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.indexes, shard_map.index, *shard_map.shards)
        pipe.hdel(keys.shard_maps, shard_map.index)
        pipe.execute()


def lookup(client: redis.Redis, keys: Keys, index: str) -> ShardMap | None:
    raw = client.hget(keys.shard_maps, index)
    return ShardMap.decode(raw) if raw else None


async def alookup(client: aioredis.Redis, keys: Keys, index: str) -> ShardMap | None:
    raw = await client.hget(keys.shard_maps, index)
    return ShardMap.decode(raw) if raw else None


async def ashard_of(client: aioredis.Redis, keys: Keys, name: str) -> ShardMap | None:
    """The map of the sharded index ``name`` is a shard of; None when it is no registered shard."""
    found = split_shard(name)
    if found is None:
        return None
    shard_map = await alookup(client, keys, found[0])
    return shard_map if shard_map is not None and found[1] in shard_map.keys else None


def rerun_hint(shard_map: ShardMap) -> str:
    """The ``ragline ingest`` options that re-ingest ``shard_map``'s index the way it was sharded."""
    if shard_map.shard_by is not None:
        return f"--index {shard_map.index} --shard-by {shard_map.shard_by}"
    # A map from before the count was kept: its keys are only the shards that got documents.
    count = shard_map.count or "N"
    return f"--index {shard_map.index} --shards {count}"


async def alist(client: aioredis.Redis, keys: Keys) -> list[ShardMap]:
    raw = await client.hgetall(keys.shard_maps)
    return [ShardMap.decode(v) for v in raw.values()]


def all_maps(client: redis.Redis, keys: Keys) -> list[ShardMap]:
    return [ShardMap.decode(v) for v in client.hvals(keys.shard_maps)]


def parse_selection(text: str) -> frozenset[str] | None:
    """The shard index names a ``--shards`` value names (``NAME:KEY,NAME:KEY``); None for
    ``all``; empty for ``none``. InvalidIndexName for a name that breaks the rule."""
    text = text.strip()
    if text in ("", ALL_SHARDS):
        return None
    if text == NO_SHARDS:
        return frozenset()
    chosen = set()
    for item in text.split(","):
        index, colon, key = item.strip().partition(":")
        if not colon or not index or not key:
            raise InvalidIndexName(f"shard {item.strip()!r} is not valid: use NAME:KEY (docs:0, docs:2024)")
        chosen.add(shard_index(check_logical_name(index), key))
    return frozenset(chosen)


def worker_queues(maps: Iterable[ShardMap], selection: frozenset[str] | None) -> list[str]:
    """The queues a retrieval worker with ``selection`` consumes: the batch queue unless it is a
    shard worker (a worker that only serves shards never waits on another, see
    docs/operations.md), and the queue of each shard it holds."""
    every = [s for m in maps for s in m.shards]
    held = every if selection is None else sorted(selection)
    coordinator = [RETRIEVAL_QUEUE] if not selection else []
    return coordinator + [shard_queue(s) for s in held]


def shard_queues(maps: Iterable[ShardMap]) -> dict[str, str]:
    """Every registered shard's queue -> the shard's index name."""
    return {shard_queue(s): s for m in maps for s in m.shards}
