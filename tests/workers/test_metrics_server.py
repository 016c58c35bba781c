"""Each worker serves its own metrics: batch sizes and stage timings, the engine's state."""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_worker_metrics(client: httpx.Client, workers) -> None:
    reply = client.post("/v1/query", json={"query": "Where does the coast train leave from?", "top_k": 2})
    assert reply.status_code == 200, reply.text
    retrieval = httpx.get(f"http://127.0.0.1:{workers.metrics_ports['retrieval']}/metrics").text
    generation = httpx.get(f"http://127.0.0.1:{workers.metrics_ports['generation']}/metrics").text
    assert "ragline_coalesced_batch_size_count" in retrieval
    assert "ragline_embed_seconds_count" in retrieval and "ragline_search_seconds_count" in retrieval
    assert 'ragline_cache_misses_total{level="embedding"}' in retrieval
    for name in (
        "ragline_ttft_seconds_count",
        "ragline_generated_tokens_total",
        "ragline_engine_kv_cache_usage",
        "ragline_engine_running_seqs",
        "ragline_prefix_cache_hit_rate",
    ):
        assert name in generation, name
