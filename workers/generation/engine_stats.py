"""Exports the engine's scheduler state to Prometheus on every engine step.

vLLM only logs its stats when something calls ``do_log_stats()``; a stat logger passed to the
engine is called with each step's stats instead, so the gauges are always current.
"""

from __future__ import annotations

from typing import Any

from ragline.broker import metrics
from vllm.v1.metrics.loggers import StatLoggerBase


class PrometheusStats(StatLoggerBase):
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self._queries = 0
        self._hits = 0

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is None:
            return
        metrics.ENGINE_RUNNING.set(scheduler_stats.num_running_reqs)
        metrics.ENGINE_WAITING.set(scheduler_stats.num_waiting_reqs)
        metrics.ENGINE_KV_USAGE.set(scheduler_stats.kv_cache_usage)
        prefix = scheduler_stats.prefix_cache_stats
        self._queries += prefix.queries
        self._hits += prefix.hits
        if self._queries:
            metrics.PREFIX_CACHE_HIT_RATE.set(self._hits / self._queries)

    def log_engine_initialized(self) -> None:
        pass
