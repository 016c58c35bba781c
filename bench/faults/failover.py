"""``redis_primary_killed`` (issue 34): the stack on a Sentinel set (``running(sentinel=True)``),
under steady load from several keys (sync queries, streams, jobs with webhooks), the primary's
process SIGKILLed; then the old primary back as a replica and a second failover, with the same
checks. Each round's figures:

- ``failover_unavailable_s``: from the kill to the first 2xx of a query that needs the workers
  (target ≤ 10 s with the sentinels' timing of ``ragline.ha``);
- ``failover_lost_accepted_jobs``: 202s that did not end ``done`` or ``failed`` with a reason
  (target 0), each with its webhook delivered once;
- ``failover_duplicate_webhooks``: deliveries past the first of a job (target 0);
- ``failover_streams_resumed``: streams cut by the failover (the connection dropped, or ended
  without a final event) that, reconnected with ``Last-Event-ID``, ended with ``done``, ``error``
  or after a ``restart`` (never a silent gap), of ``failover_streams_interrupted``;
- ``failover_500s``: responses 5xx but 503 (target 0);
- ``failover_streams_spanning``: streams open across the kill, and ``failover_stream_gaps``: those
  that ended with ``done`` but whose tokens (after the last ``restart``) are not its answer.

The JSON figure of each is the worse of the two rounds (the larger, and the fewer resumed).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.faults.receivers import running_receiver
from bench.faults.scenarios import Durations, Result, Stream, Unique, query_body, read_stream, wait_job
from bench.faults.stack import FaultStack

UNAVAILABLE_TARGET_S = 10.0


@dataclass
class Round:
    unavailable_s: float = math.nan
    accepted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    duplicates: int = 0
    undelivered: int = 0
    interrupted: int = 0
    resumed: int = 0
    spanning: int = 0  # streams open across the kill
    gaps: int = 0  # of those, ended with done but their tokens are not its answer (a silent gap)
    server_errors: int = 0
    statuses: Counter[int] = field(default_factory=Counter)

    @property
    def passed(self) -> bool:
        return (
            self.unavailable_s <= UNAVAILABLE_TARGET_S
            and not self.lost
            and self.duplicates == 0
            and self.undelivered == 0
            and self.resumed == self.interrupted
            and self.gaps == 0
            and self.server_errors == 0
        )

    def line(self, n: int) -> str:
        return (
            f"failover {n}: answered again after {self.unavailable_s:.1f} s; {len(self.accepted)} jobs "
            f"accepted, lost {len(self.lost)}, webhooks duplicated {self.duplicates}, missing "
            f"{self.undelivered}; streams open across the kill {self.spanning}, cut {self.interrupted}, "
            f"resumed {self.resumed}, with a gap {self.gaps}; "
            f"responses {dict(self.statuses)}"
        )


def _resumed(client: httpx.Client, first: Stream, headers: dict[str, str]) -> bool:
    """Reconnect a cut stream after its last event until a final one comes (``done``,
    ``error``); True when it ends so, ``restart`` events allowed on the way."""
    stream = first
    for _ in range(5):
        if stream.finals:
            return True
        if not first.request_id:
            return False
        resume = headers | ({"Last-Event-ID": stream.last_id} if stream.last_id else {})
        stream = read_stream(client, "GET", f"/v1/query/stream/{first.request_id}", headers=resume)
        if stream.status == 404:
            return False
        time.sleep(0.5)
    return bool(stream.finals)


def _round(stack: FaultStack, d: Durations, n: int) -> Round:
    keys = [stack.key(f"failover-{n}-{i}") for i in range(3)]  # several keys, as clients are
    ask = Unique(f"failover-{n}")
    result = Round()
    streams: list[tuple[Stream, dict[str, str], float, float]] = []  # with when it began and ended
    owner_of: dict[str, dict[str, str]] = {}  # each job is read with the key that made it
    stop = threading.Event()
    lock = threading.Lock()

    with running_receiver() as receiver, httpx.Client(base_url=stack.base, timeout=120) as client:

        def count(status: int) -> None:
            with lock:
                result.statuses[status] += 1

        def jobs_loop(headers: dict[str, str]) -> None:
            while not stop.wait(0.3):
                body = query_body(ask(), mode="retrieval", webhook_url=receiver.url(uuid.uuid4().hex))
                try:
                    reply = client.post("/v1/jobs", json=body, headers=headers)
                except httpx.HTTPError:
                    count(-1)
                    continue
                count(reply.status_code)
                if reply.status_code == 202:
                    with lock:
                        result.accepted.append(reply.json()["job_id"])
                        owner_of[result.accepted[-1]] = headers

        def queries_loop(headers: dict[str, str]) -> None:
            while not stop.wait(0.3):
                try:
                    body = query_body(ask(), mode="retrieval")
                    count(client.post("/v1/query", json=body, headers=headers).status_code)
                except httpx.HTTPError:
                    count(-1)

        def streams_loop(headers: dict[str, str]) -> None:
            while not stop.wait(0.3):
                began = time.monotonic()
                s = read_stream(client, "POST", "/v1/query/stream", json=query_body(ask()), headers=headers)
                count(s.status if s.status else -1)
                with lock:
                    streams.append((s, headers, began, time.monotonic()))

        loops = [
            threading.Thread(target=f, args=(h,), daemon=True)
            for h in keys
            for f in (jobs_loop, queries_loop, streams_loop)
        ]
        for t in loops:
            t.start()
        time.sleep(d.restart_s / 3)
        old = stack.primary_port()
        stack.kill(f"redis-{old}")
        killed = time.monotonic()
        probe_headers = keys[0]
        while time.monotonic() - killed < 120:
            with contextlib.suppress(httpx.HTTPError):
                probe = query_body(ask(), mode="retrieval")
                status = client.post("/v1/query", json=probe, headers=probe_headers, timeout=10).status_code
                count(status)
                if 200 <= status < 300:
                    result.unavailable_s = time.monotonic() - killed
                    break
            time.sleep(0.1)
        time.sleep(max(0.0, d.restart_s - (time.monotonic() - killed)))
        stop.set()
        for t in loops:
            t.join(300)
        # Every stream the failover cut, resumed where it stopped.
        for s, headers, began, ended in streams:
            if s.status == 200 and not s.finals:
                result.interrupted += 1
                result.resumed += _resumed(client, s, headers)
            if began < killed < ended:
                result.spanning += 1
                done = s.done()
                if done is not None and s.joined() != (done.get("answer") or ""):
                    result.gaps += 1
        views = {job_id: wait_job(client, job_id, owner_of[job_id], 180) for job_id in result.accepted}
        deadline = time.monotonic() + 60
        while len(receiver.paths()) < len(result.accepted) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # a late duplicate would come now
        deliveries = receiver.delivery_counts()
    for job_id in result.accepted:
        view: dict[str, Any] = views[job_id]
        finished = view.get("status") == "done" or (view.get("status") == "failed" and view.get("error"))
        if not finished:
            result.lost.append(job_id)
    result.duplicates = sum(k - 1 for k in deliveries.values() if k > 1)
    result.undelivered = len(result.accepted) - len(receiver.paths())
    result.server_errors = sum(k for s, k in result.statuses.items() if s >= 500 and s != 503)
    # The old primary back, as a replica of the new one; the set whole again.
    stack.start_node(old)
    stack.wait_ha()
    stack.wait_ready()
    return result


def primary_killed(stack: FaultStack, d: Durations) -> Result:
    if stack.ha_ports is None:
        return Result("redis_primary_killed", None, None, "needs the stack on a Sentinel set")
    rounds = [_round(stack, d, 1), _round(stack, d, 2)]
    figures = {
        "failover_unavailable_s": round(max(r.unavailable_s for r in rounds), 2),
        "failover_lost_accepted_jobs": sum(len(r.lost) for r in rounds),
        "failover_duplicate_webhooks": sum(r.duplicates for r in rounds),
        "failover_streams_resumed": sum(r.resumed for r in rounds),
        "failover_streams_interrupted": sum(r.interrupted for r in rounds),
        "failover_streams_spanning": sum(r.spanning for r in rounds),
        "failover_stream_gaps": sum(r.gaps for r in rounds),
        "failover_500s": sum(r.server_errors for r in rounds),
    }
    ok = all(r.passed for r in rounds)
    return Result("redis_primary_killed", figures, ok, "; ".join(r.line(i + 1) for i, r in enumerate(rounds)))
