"""bench/predict_trace.py's conversion of what its clients saw into the trace the replay reads."""

from __future__ import annotations

from bench.predict_trace import to_trace


def test_each_answered_request_becomes_its_stages_and_retrieval_batches_are_shared_times() -> None:
    rows = [
        {
            "mode": "rag", "phase": "mixed", "sent": 1.0, "status": 200, "sources_at": 1.5, "done_at": 11.5,
            "degraded": False, "completion_tokens": 128,
            "timings": {"retrieval_ms": 200.0, "generation_ms": 9800.0, "predicted_wait_ms": 9000.0},
        },
        {
            "mode": "retrieval", "phase": "mixed", "sent": 1.1, "status": 200, "done_at": 1.45,
            "timings": {"retrieval_ms": 200.0},
        },
        {"mode": "retrieval", "phase": "mixed", "sent": 1.2, "status": 503, "done_at": 1.21},
        {
            "mode": "rag", "phase": "mixed", "sent": 2.0, "status": 200, "done_at": 2.3, "degraded": True,
            "timings": {"retrieval_ms": 50.0},
        },
    ]  # fmt: skip
    trace = to_trace(rows, 8, "here")
    assert (trace["recorded"], trace["slots"], trace["workers"]) == ("here", 8, 1)
    rag, retrieval = trace["requests"]  # refused and degraded requests measure no generation
    assert rag == {
        "mode": "rag",
        "phase": "mixed",
        "arrive": 1.0,
        "retrieval": [1.3, 1.5],
        "batch": 0,
        "done": 11.5,
        "generation": [1.7, 11.5],
        "tokens": 128,
        "predicted": 9.0,
    }
    assert retrieval["retrieval"] == [1.25, 1.45] and retrieval["batch"] == 0  # the same batch
    assert "generation" not in retrieval
