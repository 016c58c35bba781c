"""bench/locustfile.py runs headless against a real ragline with keys, all three task kinds."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from tests.helpers import Api

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
QUERY = "Which platform does the coast train leave from? (locust)"


def test_locustfile_headless(auth_apis: list[Api], workers, settings: Settings, tmp_path: Path) -> None:
    client = redis.Redis.from_url(settings.redis.redis_url)
    keys = [apikeys.create(client, Keys(settings.redis.key_prefix), f"locust-{i}")[0] for i in range(2)]
    base = auth_apis[0].base
    # Warm the result cache for the RAG query, so a few seconds of load finish many requests on
    # this 2-core machine; retrieval-only requests compute (then hit) on their own.
    warm = httpx.post(base + "/v1/query", json={"query": QUERY}, headers={"X-API-Key": keys[0]}, timeout=180)
    assert warm.status_code == 200, warm.text
    queries = tmp_path / "queries.txt"
    queries.write_text(QUERY + "\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RAGLINE_API_KEYS": ",".join(keys),
        "RAGLINE_LOCUST_QUERIES": str(queries),
        "RAGLINE_LOCUST_MIX": "query=1,stream=1,retrieval=1",
        "RAGLINE_LOCUST_WAIT": "0.05,0.2",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(REPO / "bench" / "locustfile.py"),
            "--host",
            base,
            "--headless",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "5s",
            "--only-summary",
            "--csv",
            str(tmp_path / "run"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with (tmp_path / "run_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    for name in ("/v1/query (rag)", "/v1/query/stream (rag)", "/v1/query (retrieval)"):
        assert int(rows[name]["Request Count"]) > 0, rows
        assert int(rows[name]["Failure Count"]) == 0, rows
    assert "ragline /v1/query (rag): ok" in out.stdout + out.stderr
