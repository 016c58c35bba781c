"""Each worker serves its own metrics: batch sizes and stage timings, the engine's state."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from ragline.workers.metrics_server import Labelled


@pytest.mark.integration
@pytest.mark.vllm
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


def test_one_engines_worker_labels_every_metric_it_serves() -> None:
    source = CollectorRegistry()
    Counter("tokens_total", "Tokens", registry=source).inc(3)
    Histogram("ttft_seconds", "TTFT", ["queue"], buckets=(0.1, 1.0), registry=source).labels(
        "generation"
    ).observe(0.2)
    served = CollectorRegistry(auto_describe=False)
    served.register(Labelled(source, {"gpu": "2"}))
    text = generate_latest(served).decode()
    assert 'tokens_total{gpu="2"} 3.0' in text
    assert 'ttft_seconds_bucket{gpu="2",le="1.0",queue="generation"} 1.0' in text
    assert 'ttft_seconds_count{gpu="2",queue="generation"} 1.0' in text
    assert "# TYPE ttft_seconds histogram" in text
