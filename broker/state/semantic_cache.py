"""The semantic cache in Redis: earlier questions, by scope, each pointing at its answer in the
result cache (:mod:`ragline.broker.state.result_cache`).

A scope is what must be equal for one question's answer to answer another: the API key (unless
``semantic_cache_across_keys``), the index and its version, the mode, the filter and every other
option of the result cache's key, and the model. Only the question's text may differ, and the
retrieval worker judges how much by the cosine similarity of the two embeddings.

Two steps write an entry, each by the process that has what it needs. The retrieval worker,
which has the question's embedding, writes a pending entry for each miss (:meth:`SemanticStore.propose`,
with a TTL). The API, which knows whether an answer came and what it was, makes it an entry
of its scope once the answer is stored in the result cache (:meth:`SemanticCommits.commit`), and
only for a plain answer: an error, a degraded or partial answer, or one that was itself served
from the semantic cache leaves its pending entry to expire. So an entry's answer is the result
cache's: one copy, under its LRU and byte budget, gone with a re-ingest's version.

Each scope is a Redis Stream of ``{q, v, k}`` (question, float32 embedding, answer key), capped at
``semantic_cache_scope_max_entries``; a workers reads the entries after the last one it holds
(:meth:`SemanticStore.read`) into its own index. All scopes together stay within
``semantic_cache_max_entries``: past it the least recently written scopes are removed whole.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.memory_guard import AsyncMemoryGuard, MemoryGuard
from ragline.broker.redis.replies import text
from ragline.broker.redis.scripts import lua

_COMMIT = lua(__package__, "semantic_cache_commit")


def scope_of(tenant: str, index: str, version: str, options: Sequence[object]) -> str:
    """The scope of a question: ``tenant`` ('' when shared across keys), the index's name and
    version, and every other option its answer depends on (the result cache key's, in order)."""
    material = "\x1f".join([tenant, index, version, *(str(o) for o in options)])
    return hashlib.sha256(material.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class Entry:
    """One remembered question: its stream id, its text, its embedding (float32 bytes) and the
    result cache key of its answer."""

    id: str
    question: str
    vector: bytes
    answer_key: str


@dataclass(frozen=True, slots=True)
class ScopeRead:
    """A scope's entries after a given id; ``exists`` is False once its stream is gone (expired,
    or removed for the budget), whatever a reader held of it."""

    exists: bool
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Pending:
    """A miss, for the API to remember once its answer is stored."""

    request_id: str
    scope: str
    question: str
    vector: bytes


class SemanticStore:
    """The retrieval worker's side, on a sync client: read scopes, fetch answers, propose misses."""

    def __init__(
        self, client: redis.Redis, keys: Keys, *, pending_ttl_s: int, max_memory_fraction: float = 1.0
    ) -> None:
        self._client = client
        self._keys = keys
        self._pending_ttl_s = pending_ttl_s
        self._guard = MemoryGuard(client, "semantic", max_fraction=max_memory_fraction)

    def read(self, after: Mapping[str, str]) -> dict[str, ScopeRead]:
        """Each scope's entries after the id given for it ('' for all), in one round trip."""
        pipe = self._client.pipeline(transaction=False)
        for scope, last in after.items():
            key = self._keys.semantic_scope(scope)
            pipe.exists(key)
            pipe.xrange(key, min=f"({last}" if last else "-")
        replies = pipe.execute()
        read: dict[str, ScopeRead] = {}
        for i, scope in enumerate(after):
            exists, rows = replies[2 * i], replies[2 * i + 1]
            entries = [
                Entry(text(entry_id), text(fields[b"q"]), fields[b"v"], text(fields[b"k"]))
                for entry_id, fields in rows
            ]
            read[scope] = ScopeRead(bool(exists), entries)
        return read

    def answers(self, answer_keys: Sequence[str]) -> list[bytes | None]:
        """The result cache's bodies under these keys (None where one is gone)."""
        if not answer_keys:
            return []
        return cast(list[bytes | None], self._client.mget(list(answer_keys)))

    def propose(self, misses: Sequence[Pending]) -> None:
        """Write each miss's pending entry (dropped, and counted, near Redis' memory limit)."""
        if not misses:
            return
        if not self._guard.allows_write():
            self._guard.dropped("memory", len(misses))
            return
        pipe = self._client.pipeline(transaction=False)
        for miss in misses:
            key = self._keys.semantic_pending(miss.request_id)
            pipe.hset(key, mapping={"scope": miss.scope, "q": miss.question, "v": miss.vector})
            pipe.expire(key, self._pending_ttl_s)
        try:
            pipe.execute()
        except redis.exceptions.OutOfMemoryError:
            self._guard.dropped("oom", len(misses))


class SemanticCommits:
    """The API's side, on an asyncio client: a stored answer's pending entry made an entry."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        *,
        ttl_s: int,
        scope_max_entries: int,
        max_entries: int,
        max_memory_fraction: float = 1.0,
    ) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._scope_max = scope_max_entries
        self._max = max_entries
        self._guard = AsyncMemoryGuard(client, "semantic", max_fraction=max_memory_fraction)
        self._commit = client.register_script(_COMMIT)

    async def commit(self, request_id: str, scope: str, answer_key: str) -> bool:
        """Remember ``request_id``'s question in ``scope``, answered by ``answer_key``; False
        when nothing was pending for it there, or the write was dropped (Redis near its limit)."""
        if not await self._guard.allows_write():
            self._guard.dropped("memory")
            return False
        prefix = self._keys.semantic_scope("")
        try:
            added = await self._commit(
                args=[
                    self._keys.semantic_pending(request_id),
                    scope,
                    self._keys.semantic_scope(scope),
                    answer_key,
                    self._scope_max,
                    self._max,
                    f"{prefix}scopes",
                    f"{prefix}sizes",
                    f"{prefix}total",
                    self._ttl_s,
                    int(time.time() * 1000),
                ]
            )
        except redis.exceptions.OutOfMemoryError:
            self._guard.dropped("oom")
            return False
        return bool(int(added))
