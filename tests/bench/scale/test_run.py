"""bench/scale/run.py: a quick run on a tiny corpus, shards through the API included, prints the
tables, the targets and the issue's JSON keys last, and a second run takes its indexes from the
cache; the targets' verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale.index import Built
from bench.scale.probe import Probe
from bench.scale.run import Row, headline, parse_size, targets
from ragline.processes import redis_answers

# bench/scale/run.py's default for the served stack: a database of its own, which the run flushes.
SHARD_REDIS_URL = "redis://127.0.0.1:6379/13"

ISSUE_KEYS = {
    "hnsw_1m_p99_ms",
    "hnsw_1m_recall",
    "disk_10m_rss_gb",
    "disk_10m_recall",
    "disk_10m_p99_ms",
    "shards4_over_1_p99",
}


def _quick(home: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "bench.scale", "--quick", "--sizes", "5k", "--queries", "100"]
    cmd += ["--home", str(home), "--out", str(out)]
    # The sharded corpus the size of the other (its HNSW index reused), and few rounds.
    cmd += ["--shards", "--shard-size", "5k", "--shard-rounds", "20", "--shard-redis-url", SHARD_REDIS_URL]
    # Fewer PQ sub-quantizers than the default: their training is most of a tiny run's time.
    env = {**os.environ, "RAGLINE_IVF_PQ_M": "8"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, env=env)
    return done.stdout.strip().splitlines()


@pytest.mark.redis  # bench.scale in a subprocess: FAISS builds, a served stack on DB 13
@pytest.mark.stack
@pytest.mark.model
@pytest.mark.slow
def test_quick_run_reports_every_type_and_the_issues_keys(tmp_path: Path) -> None:
    if not redis_answers(SHARD_REDIS_URL):
        pytest.skip(f"the shard measurement serves its indexes through Redis at {SHARD_REDIS_URL}")
    lines = _quick(tmp_path / "home", tmp_path / "out")
    assert any(line.startswith("| vectors | index | build s") for line in lines)
    for index_type in ("hnsw", "ivfpq", "ivfpq-disk"):
        row = next(line for line in lines if line.startswith(f"| 5k | {index_type} |"))
        recall = float(row.split("|")[7])
        assert 0.3 <= recall <= 1.0, row  # a sanity bound on a tiny corpus, not a measurement
    assert any(line.startswith("| shards (5,000 vectors, through the API) |") for line in lines)
    for config in ("unsharded", "1 shard", "2 shards", "4 shards"):
        row = next(line for line in lines if line.startswith(f"| {config} |")).split("|")
        assert int(row[2]) == 20 and float(row[4]) > 0, row  # every query timed: none partial or failed
        assert row[6].strip() == "0 / 0", row
    verdict = next(line for line in lines if line.startswith("| 4 shards: P99 <= 1.5x unsharded |"))
    assert verdict.endswith(("| met |", "| **missed** |")), verdict
    assert (tmp_path / "out" / "scale_latency.png").stat().st_size > 0
    last = json.loads(lines[-1])
    assert set(last) == ISSUE_KEYS
    assert isinstance(last.pop("shards4_over_1_p99"), float)
    assert all(v is None for v in last.values())  # neither 1M nor 10M was run

    again = _quick(tmp_path / "home", tmp_path / "out")
    assert all("(cached)" in line for line in again if line.startswith("| 5k |"))
    served = [line for line in again if line.startswith(("| unsharded |", "| 4 shards |"))]
    assert len(served) == 2 and all("(cached)" in line for line in served), served


def _probe(p99_ms: float, recall: float, rss_gb: float) -> Probe:
    return Probe(0.1, rss_gb, rss_gb, 0.0, recall, p99_ms / 2, p99_ms, 1.0, 2.0)


def test_targets_and_headline_read_the_1m_hnsw_and_10m_rows() -> None:
    built = Built(Path("/x"), "hnsw", 1.0, 1.0, cached=True)
    rows = [
        Row(1_000_000, "hnsw", built, _probe(8.0, 0.96, 2.0)),
        Row(10_000_000, "hnsw", None, None, "does not fit"),
        Row(10_000_000, "ivfpq", built, _probe(50.0, 0.95, 9.0)),
        Row(10_000_000, "ivfpq-disk", built, _probe(120.0, 0.92, 1.5)),
    ]
    verdicts = targets(rows, None)
    assert "| 1M HNSW: P99 <= 10 ms at recall@10 >= 0.95 | met |" in verdicts
    # ivfpq is over 8 GB and ivfpq-disk over 100 ms: no 10M index meets all three
    assert "(ivfpq, ivfpq-disk) | **missed** |" in verdicts
    assert headline(rows, None) == {
        "hnsw_1m_p99_ms": 8.0,
        "hnsw_1m_recall": 0.96,
        "disk_10m_rss_gb": 1.5,
        "disk_10m_recall": 0.92,
        "disk_10m_p99_ms": 120.0,
        "shards4_over_1_p99": None,
    }


def test_sizes_read_as_the_issue_writes_them() -> None:
    assert [parse_size(s) for s in ("20k", "100k", "1m", "10M", "2500")] == [
        20_000,
        100_000,
        10**6,
        10**7,
        2500,
    ]
    with pytest.raises(ValueError):
        parse_size("12")
