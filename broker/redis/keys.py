"""Redis key names, in one place so the API, the workers and operators agree on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "ragline"

    def events(self, request_id: str) -> str:
        """The per-request event stream (sources, token, done, error)."""
        return f"{self.prefix}:ev:{request_id}"

    def stream_owner(self, request_id: str) -> str:
        """Who may read a request's stream again (its caller's key id), as long as the stream lives."""
        return f"{self.prefix}:own:{request_id}"

    @property
    def indexes(self) -> str:
        """Hash: index name -> JSON {version, path, chunks, dim}."""
        return f"{self.prefix}:indexes"

    @property
    def shard_maps(self) -> str:
        """Hash: sharded index name -> JSON {index, shard_by, keys, count} (broker/state/shards.py)."""
        return f"{self.prefix}:shardmaps"

    def shard_reply(self, search_id: str) -> str:
        """List with a TTL: the replies of one scatter's shard searches, for its coordinator."""
        return f"{self.prefix}:shardreply:{search_id}"

    def documents(self, index: str, version: str) -> str:
        """Hash: one index version's documents, document id -> JSON {title, path, chunks}."""
        return f"{self.prefix}:docs:{index}:{version}"

    def document_ids(self, index: str, version: str) -> str:
        """Sorted set (all scores 0): the same version's document ids, for pages in id order."""
        return f"{self.prefix}:docids:{index}:{version}"

    def ingest_lock(self, index: str) -> str:
        """String with a TTL: the job building the next version of ``index`` (one at a time)."""
        return f"{self.prefix}:ingest-lock:{index}"

    @property
    def ingest_ring(self) -> str:
        """List: the API keys with ingest jobs waiting, in the order their turns come (each once)."""
        return f"{self.prefix}:ingest-ring"

    @property
    def ingest_parked(self) -> str:
        """List: API keys with ingest jobs waiting while one of theirs runs; back in the ring after."""
        return f"{self.prefix}:ingest-parked"

    def ingest_waiting(self, principal: str) -> str:
        """List: one API key's waiting ingest jobs (ids), oldest first."""
        return f"{self.prefix}:ingest-waiting:{principal}"

    @property
    def ingest_tasks(self) -> str:
        """Hash: ingest job id -> its queued task (JSON), waiting or running, until it ends."""
        return f"{self.prefix}:ingest-tasks"

    @property
    def ingest_running(self) -> str:
        """Sorted set: running ingest job id -> when its lease ends (unix ms, Redis's clock)."""
        return f"{self.prefix}:ingest-running"

    def workers(self, queue: str) -> str:
        """Sorted set: live worker id -> last heartbeat (unix seconds)."""
        return f"{self.prefix}:workers:{queue}"

    @property
    def result_cache(self) -> str:
        """Prefix of level-1 cache entries; ``<this>:lru`` is their recency index, ``<this>:sizes``
        (entry -> bytes) and ``<this>:bytes`` (their total) keep the byte budget."""
        return f"{self.prefix}:qc"

    def semantic_scope(self, scope: str) -> str:
        """Stream: one scope's remembered questions, each ``{q: text, v: float32 embedding, k:
        its answer's result cache key}``; ``<prefix>:sc:scopes`` (scope key -> last write, ms)
        and ``<prefix>:sc:sizes`` (scope key -> entries) keep the semantic cache's budget."""
        return f"{self.prefix}:sc:{scope}"

    def semantic_pending(self, request_id: str) -> str:
        """Hash with a TTL: a semantic cache miss's question and embedding, written by the retrieval
        worker, made an entry of its scope by the API once the answer is in the result cache."""
        return f"{self.prefix}:sc-pending:{request_id}"

    def embedding(self, digest: str) -> str:
        """Level-2 cache: text digest -> float32 embedding bytes."""
        return f"{self.prefix}:emb:{digest}"

    @property
    def embedding_lru(self) -> str:
        """Sorted set: embedding cache key -> last write or hit (ms), for its entry budget."""
        return f"{self.prefix}:emb:lru"

    def job(self, job_id: str) -> str:
        """Hash: one async job's record (status, timestamps, request, result, delivery state)."""
        return f"{self.prefix}:job:{job_id}"

    def jobs_of(self, principal: str) -> str:
        """Sorted set: a principal's job ids -> creation time, for its record budget."""
        return f"{self.prefix}:jobs:{principal}"

    def job_bytes_of(self, principal: str) -> str:
        """Hash: a principal's finished job ids -> each record's bytes, and ``total`` (its byte budget)."""
        return f"{self.prefix}:jobbytes:{principal}"

    def open_jobs(self, principal: str) -> str:
        """Sorted set: a principal's jobs not yet seen finished -> creation time, for its cap."""
        return f"{self.prefix}:jobs-open:{principal}"

    def leases(self, kind: str, principal: str) -> str:
        """Sorted set: a principal's leases of one kind (requests, streams) -> expiry (unix ms)."""
        return f"{self.prefix}:lease:{kind}:{principal}"

    def idempotency(self, digest: str) -> str:
        """String: the job id an Idempotency-Key maps to (digest: sha256 of principal and key)."""
        return f"{self.prefix}:idem:{digest}"

    def cancel(self, request_id: str) -> str:
        """String with a short TTL: present while a request (or job) is to be cancelled."""
        return f"{self.prefix}:cancel:{request_id}"

    def webhook_secret(self, principal: str) -> str:
        """String: the principal's own webhook HMAC secret (else Settings.webhook_secret)."""
        return f"{self.prefix}:webhook-secret:{principal}"

    @property
    def webhook_schedule(self) -> str:
        """Sorted set: "{job_id}:{attempt}" -> unix time the delivery attempt is due."""
        return f"{self.prefix}:webhooks:scheduled"

    @property
    def webhook_dead(self) -> str:
        """List: JSON of each delivery given up after its last attempt, newest first."""
        return f"{self.prefix}:webhooks:dead"

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
