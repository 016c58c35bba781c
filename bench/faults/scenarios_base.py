"""What bench/faults' scenario modules share: a scenario's :class:`Result`, the run's
:class:`Durations`, unique questions, and the requests most scenarios make."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from bench.faults.stack import INDEX
from bench.overload import questions

MIB = 1 << 20
FINALS = ("done", "error")


@dataclass
class Result:
    name: str
    value: Any  # the figure in the JSON line
    passed: bool | None  # None: not measured (a prerequisite missing)
    detail: str


@dataclass
class Durations:
    pool_s: float = 30.0
    memory_s: float = 60.0
    restart_s: float = 30.0
    soak_s: float = 600.0
    fuzz_examples: int = 10
    stream_clients: int = 4
    capacity: float | None = None  # full-RAG req/s for the soak; measured when not given
    ingest_queries: int = 200  # retrieval questions timed before hostile uploads, and beside them
    fair_jobs: int = 100  # one key's queued uploads before another key's one


class Unique:
    """Questions over the index that no cache has seen: each call a new one."""

    def __init__(self, tag: str) -> None:
        self._questions = questions()
        self._tag = f"{tag}-{uuid.uuid4().hex[:6]}"
        self._n = 0
        self._lock = threading.Lock()

    def __call__(self, i: int | None = None) -> str:
        with self._lock:
            if i is None:
                i, self._n = self._n, self._n + 1
        return f"{self._questions[i % len(self._questions)]} [{self._tag}-{i}]"


def query_body(query: str, **extra: Any) -> dict[str, Any]:
    return {"query": query, "index": INDEX, **extra}


def wait_job(client: httpx.Client, job_id: str, headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """The job's view once final (or as it is when ``timeout_s`` passes); ``{}`` for a 404."""
    deadline = time.monotonic() + timeout_s
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            reply = client.get(f"/v1/jobs/{job_id}", headers=headers)
        except httpx.HTTPError:
            time.sleep(0.5)
            continue
        if reply.status_code == 404:
            return {}
        if reply.status_code == 200:
            view = reply.json()
            if view["status"] in ("done", "failed", "cancelled"):
                return view
        time.sleep(0.2)
    return view
