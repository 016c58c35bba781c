"""Load-test a running ragline with Locust: RAG answers, streams and retrieval-only queries.

    RAGLINE_API_KEYS=rl_a,rl_b locust -f bench/locustfile.py --host http://127.0.0.1:8000
    RAGLINE_API_KEYS=rl_a locust -f bench/locustfile.py --host http://127.0.0.1:8000 \\
        --headless -u 50 -r 10 -t 2m

Environment (all optional):

- ``RAGLINE_API_KEYS`` — comma-separated keys; user n uses key n mod len (spread load over keys
  to exercise per-key limits). Empty: no key is sent (an API with RAGLINE_AUTH_ENABLED=false).
- ``RAGLINE_LOCUST_MIX`` — task weights, default ``query=3,stream=1,retrieval=2``.
- ``RAGLINE_LOCUST_QUERIES`` — a file with one query per line (default: a few built-in ones).
- ``RAGLINE_LOCUST_UNIQUE`` — ``1`` appends a random tag to every query so the result cache never
  answers (measures the full path); default ``0``.
- ``RAGLINE_LOCUST_INDEX`` — the index to ask (default: the server's default index).
- ``RAGLINE_LOCUST_DEADLINE_MS`` — sent as ``X-Request-Deadline-Ms``.
- ``RAGLINE_LOCUST_WAIT`` — ``min,max`` seconds each user waits between requests (default ``0.5,2``).
- ``RAGLINE_LOCUST_REJECTIONS_OK`` — ``1`` counts 429 and 503 as successes (when testing that
  admission control sheds load); by default they are failures, grouped by status in the report.

Degraded answers (``degraded: true``: generation was too busy for the deadline) count as
successes; at the end a line per task says how many were degraded and rejected.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from locust import HttpUser, between, events, task

DEFAULT_QUERIES = [
    "What does the global statement do?",
    "How does a with statement use a context manager?",
    "What does the assert statement do?",
    "How are default argument values evaluated?",
    "What is the difference between a list and a tuple?",
]


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def _mix() -> dict[str, int]:
    weights = {"query": 3, "stream": 1, "retrieval": 2}
    for part in filter(None, _env("RAGLINE_LOCUST_MIX").split(",")):
        name, _, weight = part.partition("=")
        if name.strip() not in weights:
            raise ValueError(f"RAGLINE_LOCUST_MIX: unknown task {name!r} (query, stream, retrieval)")
        weights[name.strip()] = int(weight)
    return weights


def _queries() -> list[str]:
    path = _env("RAGLINE_LOCUST_QUERIES")
    if not path:
        return DEFAULT_QUERIES
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    return [line for line in lines if line] or DEFAULT_QUERIES


KEYS = [k for k in (p.strip() for p in _env("RAGLINE_API_KEYS").split(",")) if k]
MIX = _mix()
QUERIES = _queries()
UNIQUE = _env("RAGLINE_LOCUST_UNIQUE", "0") == "1"
INDEX = _env("RAGLINE_LOCUST_INDEX")
DEADLINE_MS = _env("RAGLINE_LOCUST_DEADLINE_MS")
REJECTIONS_OK = _env("RAGLINE_LOCUST_REJECTIONS_OK", "0") == "1"
WAIT_MIN, WAIT_MAX = (float(x) for x in _env("RAGLINE_LOCUST_WAIT", "0.5,2").split(","))

_user_numbers = itertools.count()
_outcomes: Counter[tuple[str, str]] = Counter()
_outcomes_lock = threading.Lock()


def _count(task_name: str, outcome: str) -> None:
    with _outcomes_lock:
        _outcomes[(task_name, outcome)] += 1


class RaglineUser(HttpUser):
    wait_time = between(WAIT_MIN, WAIT_MAX)

    def on_start(self) -> None:
        number = next(_user_numbers)
        self.headers: dict[str, str] = {}
        if KEYS:
            self.headers["Authorization"] = f"Bearer {KEYS[number % len(KEYS)]}"
        if DEADLINE_MS:
            self.headers["X-Request-Deadline-Ms"] = DEADLINE_MS

    def _body(self, mode: str) -> dict[str, Any]:
        query = random.choice(QUERIES)
        if UNIQUE:
            query = f"{query} ({random.getrandbits(48):x})"
        body: dict[str, Any] = {"query": query, "mode": mode}
        if INDEX:
            body["index"] = INDEX
        return body

    def _judge(self, task_name: str, response: Any, *, degraded: bool = False) -> None:
        status = response.status_code
        if status == 200:
            _count(task_name, "degraded" if degraded else "ok")
            response.success()
        elif status in (429, 503):
            _count(task_name, str(status))
            if REJECTIONS_OK:
                response.success()
            else:
                response.failure(f"rejected {status} (Retry-After {response.headers.get('Retry-After')})")
        else:
            _count(task_name, str(status))
            response.failure(f"HTTP {status}: {response.text[:200]}")

    def _query(self, task_name: str, mode: str) -> None:
        with self.client.post(
            "/v1/query", json=self._body(mode), headers=self.headers, name=task_name, catch_response=True
        ) as response:
            degraded = False
            if response.status_code == 200:
                try:
                    degraded = bool(response.json().get("degraded"))
                except ValueError:
                    response.failure("200 without a JSON body")
                    return
            self._judge(task_name, response, degraded=degraded)

    @task(MIX["query"])
    def query(self) -> None:
        self._query("/v1/query (rag)", "rag")

    @task(MIX["retrieval"])
    def retrieval(self) -> None:
        self._query("/v1/query (retrieval)", "retrieval")

    @task(MIX["stream"])
    def stream(self) -> None:
        name = "/v1/query/stream (rag)"
        with self.client.post(
            "/v1/query/stream",
            json=self._body("rag"),
            headers=self.headers,
            name=name,
            stream=True,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                self._judge(name, response)
                return
            event, done = None, None
            # The response time Locust records covers the whole stream, up to the final event.
            for line in response.iter_lines(decode_unicode=True):
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("done", "error"):
                    done = (event, json.loads(line[6:]))
                    break
            if done is None:
                _count(name, "incomplete")
                response.failure("the stream ended without a final event")
            elif done[0] == "error":
                _count(name, "error event")
                response.failure(f"error event: {done[1].get('message')}")
            else:
                self._judge(name, response, degraded=bool(done[1].get("degraded")))


@events.test_stop.add_listener
def _summary(**_: Any) -> None:
    with _outcomes_lock:
        rows = sorted(_outcomes.items())
    by_task: dict[str, dict[str, int]] = {}
    for (task_name, outcome), n in rows:
        by_task.setdefault(task_name, {})[outcome] = n
    for task_name, outcomes in by_task.items():
        print(f"ragline {task_name}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
