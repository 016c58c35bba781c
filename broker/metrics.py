"""Every Prometheus metric ragline exports, named once so dashboards and alerts match the code.

Each process (API, each worker) serves its own registry: the API on ``/metrics``, each worker on
``RAGLINE_WORKER_METRICS_PORT`` (0 = off). One process per pod makes multiprocess mode unneeded.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# 1 ms .. 60 s: cache hits sit at the bottom, a long generation at the top.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUESTS = Counter("ragline_requests_total", "HTTP requests answered", ["endpoint", "status"])
REQUEST_SECONDS = Histogram(
    "ragline_request_seconds",
    "End-to-end request latency at the API",
    ["endpoint", "mode"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_WAIT_SECONDS = Histogram(
    "ragline_queue_wait_seconds", "Time a task waited in its queue", ["queue"], buckets=LATENCY_BUCKETS
)
EMBED_SECONDS = Histogram("ragline_embed_seconds", "Query embedding time per batch", buckets=LATENCY_BUCKETS)
SEARCH_SECONDS = Histogram("ragline_search_seconds", "FAISS search time per batch", buckets=LATENCY_BUCKETS)
TTFT_SECONDS = Histogram("ragline_ttft_seconds", "Engine time to first token", buckets=LATENCY_BUCKETS)
GENERATION_SECONDS = Histogram(
    "ragline_generation_seconds", "Engine time for a whole answer", buckets=LATENCY_BUCKETS
)
COALESCED_BATCH = Histogram(
    "ragline_coalesced_batch_size",
    "Queries per coalesced embed+search call",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)

QUEUE_DEPTH = Gauge("ragline_queue_depth", "True waiting depth: all priority lists plus unacked", ["queue"])
QUEUE_RATE = Gauge("ragline_queue_service_rate", "Completions per second (EWMA)", ["queue"])
LIVE_WORKERS = Gauge("ragline_live_workers", "Workers with a fresh heartbeat", ["queue"])
QUEUE_PREDICTED_WAIT = Gauge(
    "ragline_queue_predicted_wait_seconds",
    "Seconds a request arriving now is predicted to wait for this queue's answer, as admission sees it",
    ["queue"],
)

SHARD_SEARCHES = Counter(
    "ragline_shard_searches_total",
    "Shard searches of sharded indexes, by shard and where run",
    ["shard", "where"],
)
SHARD_QUEUE_WAITING = Gauge(
    "ragline_shard_queue_waiting", "Shard searches waiting in a shard's queue (the API's view)", ["queue"]
)
SHARD_MISSING = Counter(
    "ragline_shard_missing_total",
    "Shards left out of an answer: no live worker on their queue, or no reply within their budget",
    ["shard"],
)

CACHE_HITS = Counter("ragline_cache_hits_total", "Cache hits", ["level"])
CACHE_MISSES = Counter("ragline_cache_misses_total", "Cache misses", ["level"])
CACHE_WRITES_DROPPED = Counter(
    "ragline_cache_writes_dropped_total",
    "Cache entries not written: Redis near its memory limit (memory) or refusing writes (oom)",
    ["level", "reason"],
)
CACHE_ENTRIES_SHED = Counter(
    "ragline_cache_entries_shed_total",
    "Cache entries evicted early to give Redis memory back near its limit",
    ["level"],
)
REJECTIONS = Counter("ragline_rejections_total", "Requests refused at the door", ["reason"])
DEGRADED = Counter("ragline_degraded_total", "Answers degraded to retrieval-only", ["reason"])
STREAM_STALLS = Counter(
    "ragline_stream_stalls_total", "SSE streams ended because nothing new came for the stall limit"
)
GENERATED_TOKENS = Counter("ragline_generated_tokens_total", "Tokens generated")
PREFIX_CACHE_HIT_RATE = Gauge("ragline_prefix_cache_hit_rate", "Engine prefix-cache hit rate")

ENGINE_RUNNING = Gauge("ragline_engine_running_seqs", "Sequences the engine is running")
ENGINE_WAITING = Gauge("ragline_engine_waiting_seqs", "Sequences waiting in the engine")
ENGINE_KV_USAGE = Gauge("ragline_engine_kv_cache_usage", "Fraction of the KV cache in use")

WEBHOOK_DELIVERIES = Counter("ragline_webhook_deliveries_total", "Webhook delivery attempts", ["outcome"])
WEBHOOK_DEAD_LETTERS = Counter(
    "ragline_webhook_dead_letters_total", "Webhooks given up after the last attempt"
)
UNREPLICATED_WRITES = Counter(
    "ragline_unreplicated_writes_total",
    "Durable writes (RAGLINE_REDIS_WAIT_REPLICAS) no replica confirmed in time: refused, retried or deferred",
    ["write"],
)
