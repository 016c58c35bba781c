"""The API process never loads workers, torch, faiss or vllm."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from fastapi.testclient import TestClient
from ragline.api.app import create_app
with TestClient(create_app(), base_url="http://localhost") as client:
    client.get("/healthz")
    client.get("/readyz")
    client.post("/v1/query", json={"query": ""})
heavy_roots = {"torch", "faiss", "vllm", "sentence_transformers", "transformers"}
heavy = sorted(
    m for m in sys.modules if m.split(".")[0] in heavy_roots or m.startswith(("ragline.workers", "workers"))
)
print(",".join(heavy))
"""


def test_api_process_imports_nothing_heavy(redis_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={"RAGLINE_REDIS_URL": redis_url, "RAGLINE_DEV_MODE": "true", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"heavy modules in the API process: {out.stdout}"
