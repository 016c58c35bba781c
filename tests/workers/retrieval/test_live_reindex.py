"""Re-ingesting replaces an index while workers serve; they pick the new version up unrestarted."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from ragline.broker.config.settings import Settings

pytestmark = pytest.mark.integration


def _top_source(client: httpx.Client, query: str) -> str:
    reply = client.post("/v1/query", json={"query": query, "mode": "retrieval", "index": "live", "top_k": 1})
    assert reply.status_code == 200, reply.text
    return reply.json()["sources"][0]["text"]


def test_reingest_is_served_without_restart(
    client: httpx.Client, workers, settings: Settings, embedder, tmp_path: Path
) -> None:
    from ragline.workers.retrieval.ingest import ingest

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "ferry.md").write_text("# Ferry\n\nThe island ferry departs at 08:40 from pier 3.")
    ingest(settings, [tmp_path / "v1"], index_name="live", embedder=embedder, progress=False)
    assert "08:40" in _top_source(client, "When does the island ferry depart?")

    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "ferry.md").write_text(
        "# Ferry\n\nFrom May the island ferry departs at 09:55 from pier 5."
    )
    ingest(settings, [tmp_path / "v2"], index_name="live", embedder=embedder, progress=False)
    deadline = time.monotonic() + 5
    while "09:55" not in (text := _top_source(client, "When does the island ferry depart?")):
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    assert workers.retrieval.proc.poll() is None  # the same worker process, never restarted
