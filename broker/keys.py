"""Redis key names, in one place so the API, the workers and operators agree on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "ragline"

    def events(self, request_id: str) -> str:
        """The per-request event stream (sources, token, done, error)."""
        return f"{self.prefix}:ev:{request_id}"

    @property
    def indexes(self) -> str:
        """Hash: index name -> JSON {version, path, chunks, dim}."""
        return f"{self.prefix}:indexes"

    def workers(self, queue: str) -> str:
        """Sorted set: live worker id -> last heartbeat (unix seconds)."""
        return f"{self.prefix}:workers:{queue}"

    @property
    def result_cache(self) -> str:
        """Prefix of level-1 cache entries; ``<this>:lru`` is their recency index."""
        return f"{self.prefix}:qc"

    def embedding(self, digest: str) -> str:
        """Level-2 cache: text digest -> float32 embedding bytes."""
        return f"{self.prefix}:emb:{digest}"

    @property
    def backpressure(self) -> str:
        """Hash: the shared backpressure snapshot (``<queue>:<field>`` per queue, and ``t``)."""
        return f"{self.prefix}:bp"

    @property
    def backpressure_lease(self) -> str:
        """String with a short TTL: held by the API process that refreshes the snapshot."""
        return f"{self.prefix}:bp:lease"

    def done(self, queue: str) -> str:
        """Hash: completions on a queue so far, ``requests`` and ``tasks`` (a retrieval task is a batch)."""
        return f"{self.prefix}:done:{queue}"

    @property
    def api_keys(self) -> str:
        """Hash: SHA-256 of an API key -> JSON {id, name, created_at, revoked, rate, burst}."""
        return f"{self.prefix}:apikeys"

    def rate_bucket(self, scope: str) -> str:
        """Hash {tokens, ts}: one token bucket (scope: ``key:<digest>`` or ``global``)."""
        return f"{self.prefix}:rl:{scope}"
