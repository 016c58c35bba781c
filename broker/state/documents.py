"""Each index version's documents, listed in Redis: what ``GET /v1/indexes/{name}/documents`` shows.

The API never reads an index's files, so whoever writes a version (an ingest, or a retrieval
worker that finds a current version unlisted at its start) lists its documents here first and
registers the version after. The list is per version: the registry's version picks the list, so
a swap changes both at once; a replaced version's list expires a while after the swap.

``<prefix>:docs:<index>:<version>`` hash: document id -> JSON ``{title, path, chunks}``;
``<prefix>:docids:<index>:<version>`` sorted set of the same ids (scores 0), paged in id order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import cast

import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.replies import text

# A replaced version's list outlives the swap by this much: a page read just before it still
# finds the rest of its list.
RETIRED_TTL_S = 3600
_WRITE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class DocumentEntry:
    id: str
    title: str  # its first section's title path
    path: str  # the file it came from (`path` metadata), else its id
    chunks: int

    def encode(self) -> str:
        fields = asdict(self)
        del fields["id"]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decode(cls, doc_id: str, raw: str | bytes) -> DocumentEntry:
        fields = json.loads(raw)
        return cls(
            id=doc_id, title=str(fields["title"]), path=str(fields["path"]), chunks=int(fields["chunks"])
        )


def write(client: redis.Redis, keys: Keys, index: str, version: str, entries: Iterable[DocumentEntry]) -> int:
    """List ``entries`` as ``version``'s documents (replacing any list it had); returns how many."""
    table, ids = keys.documents(index, version), keys.document_ids(index, version)
    client.delete(table, ids)
    batch: list[DocumentEntry] = []
    count = 0

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        pipe.hset(table, mapping={e.id: e.encode() for e in batch})
        pipe.zadd(ids, dict.fromkeys((e.id for e in batch), 0))
        pipe.execute()

    for entry in entries:
        batch.append(entry)
        count += 1
        if len(batch) >= _WRITE_BATCH:
            flush()
            batch = []
    if batch:
        flush()
    return count


def listed(client: redis.Redis, keys: Keys, index: str, version: str) -> bool:
    return bool(client.exists(keys.document_ids(index, version)))


def retire(client: redis.Redis, keys: Keys, index: str, version: str, *, ttl_s: int = RETIRED_TTL_S) -> None:
    """``version`` was replaced (or its index deleted): its list expires in ``ttl_s``."""
    pipe = client.pipeline(transaction=False)
    pipe.expire(keys.documents(index, version), ttl_s)
    pipe.expire(keys.document_ids(index, version), ttl_s)
    pipe.execute()


async def apage(
    client: aioredis.Redis, keys: Keys, index: str, version: str, *, after: str | None, limit: int
) -> tuple[list[DocumentEntry], str | None] | None:
    """Up to ``limit`` documents with ids after ``after``, in id order, and the cursor of the next
    page (None on the last); None when the version has no list."""
    ids_key = keys.document_ids(index, version)
    start = "(" + after if after else "-"
    members = await client.zrange(ids_key, start, "+", bylex=True, offset=0, num=limit + 1)
    if not members and not await client.exists(ids_key):
        return None
    more = len(members) > limit
    ids = [text(m) for m in cast(list[bytes], members[:limit])]  # members: not (member, score) pairs
    raws = await client.hmget(keys.documents(index, version), ids) if ids else []
    entries = [DocumentEntry.decode(i, raw) for i, raw in zip(ids, raws, strict=True) if raw is not None]
    return entries, (ids[-1] if more and ids else None)


async def acount(client: aioredis.Redis, keys: Keys, index: str, version: str) -> int:
    return int(await client.zcard(keys.document_ids(index, version)))


async def aget(
    client: aioredis.Redis, keys: Keys, index: str, version: str, doc_id: str
) -> DocumentEntry | None:
    raw = await client.hget(keys.documents(index, version), doc_id)
    return DocumentEntry.decode(doc_id, raw) if raw is not None else None


async def apage_merged(
    client: aioredis.Redis, keys: Keys, versions: list[tuple[str, str]], *, after: str | None, limit: int
) -> tuple[list[DocumentEntry], str | None] | None:
    """:func:`apage` over several (index, version) lists as one, the shards of a sharded index:
    an id listed in more than one (a document re-ingested under another shard key) comes once,
    its chunks summed, so that a cursor never skips or repeats it. None when any has no list."""
    start = "(" + after if after else "-"
    pipe = client.pipeline(transaction=False)
    for index, version in versions:
        pipe.zrange(keys.document_ids(index, version), start, "+", bylex=True, offset=0, num=limit + 1)
        pipe.exists(keys.document_ids(index, version))
    found = await pipe.execute()
    per_list: list[list[bytes]] = found[0::2]
    if not all(found[1::2]):
        return None
    # Each list's first limit + 1 ids after the cursor hold the merged list's first limit + 1.
    ids = sorted(set().union(*per_list))
    more = len(ids) > limit
    ids = ids[:limit]
    merged: dict[bytes, DocumentEntry] = {}
    if ids:
        pipe = client.pipeline(transaction=False)
        for index, version in versions:
            pipe.hmget(keys.documents(index, version), ids)
        for raws in await pipe.execute():
            for doc_id, raw in zip(ids, raws, strict=True):
                if raw is None:
                    continue
                entry = DocumentEntry.decode(doc_id.decode(), raw)
                seen = merged.get(doc_id)
                merged[doc_id] = entry if seen is None else replace(seen, chunks=seen.chunks + entry.chunks)
    entries = [merged[i] for i in ids if i in merged]
    return entries, (ids[-1].decode() if more and ids else None)


async def acount_merged(client: aioredis.Redis, keys: Keys, versions: list[tuple[str, str]]) -> int:
    """Documents over several lists; one listed in two counts in each (as the index's entry does)."""
    pipe = client.pipeline(transaction=False)
    for index, version in versions:
        pipe.zcard(keys.document_ids(index, version))
    return sum(int(n) for n in await pipe.execute())


async def aholders(
    client: aioredis.Redis, keys: Keys, versions: list[tuple[str, str]], doc_id: str
) -> list[str]:
    """The indexes among ``versions`` whose list has ``doc_id``."""
    pipe = client.pipeline(transaction=False)
    for index, version in versions:
        pipe.hexists(keys.documents(index, version), doc_id)
    return [index for (index, _), held in zip(versions, await pipe.execute(), strict=True) if held]
