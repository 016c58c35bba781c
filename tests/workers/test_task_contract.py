"""Each worker's task refuses a payload that breaks the contract: a clear log line, no exception
(an exception would only have Celery log a traceback, and a redelivery would fail the same way).

The tasks are called in-process; they stop at decoding, before any Redis, model or engine."""

from __future__ import annotations

import logging
from typing import Any

import pytest


def _task(name: str) -> Any:
    if name == "retrieve":
        from ragline.workers.retrieval.app import retrieve

        return retrieve
    if name == "generate":
        from ragline.workers.generation.app import generate

        return generate
    from ragline.workers.callbacks import deliver_webhook

    return deliver_webhook


@pytest.mark.parametrize(
    ("name", "kwargs", "needle"),
    [
        ("retrieve", {"requests": [{"request_id": "r1", "query": "q"}]}, "requests.0.top_k: Field required"),
        ("retrieve", {"queries": []}, "queries: Extra inputs are not permitted"),
        ("generate", {"request_id": "r1", "query": "q", "sources": "none", "enqueued_at": 1.0}, "sources"),
        ("deliver_webhook", {"job_id": "j1", "attempt": "first"}, "attempt"),
    ],
)
def test_a_task_that_breaks_the_contract_is_refused_with_a_log(
    name: str, kwargs: dict[str, Any], needle: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert _task(name)(**kwargs) is None
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"rejected ragline.{name} task" in record.getMessage() and needle in record.getMessage()
