"""The admission policy on hand-made snapshots: admit, degrade, or 503 with Retry-After."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from ragline.api.health.protocol import QueuesHealth, ServiceLevel
from ragline.api.pipeline.admission import Action, Admission
from ragline.broker.config.settings import ApiSettings, Settings
from ragline.broker.contract.queues import GENERATION_QUEUE, RETRIEVAL_QUEUE
from ragline.broker.limits.backpressure import (
    BackpressureMonitor,
    QueueLoad,
    ServiceTimes,
    Snapshot,
    count_done,
)
from ragline.broker.redis.keys import Keys

from tests.helpers import Workers, start_api


@dataclass
class FakeMonitor:
    snapshot: Snapshot | None
    age: float = 0.0

    def age_s(self) -> float:
        return self.age


def _snapshot(retrieval: QueueLoad, generation: QueueLoad, at_ms: int = 1) -> Snapshot:
    return Snapshot(
        at_ms=at_ms, queues={"retrieval": retrieval, "generation": generation}, received=time.monotonic()
    )


IDLE = QueueLoad("x")


def _served(seconds: float, *, concurrency: float = 1.0, slots: int = 1, **load: int) -> QueueLoad:
    """A queue whose recent tasks all took ``seconds`` at ``concurrency``, ``slots`` per worker."""
    service = ServiceTimes.of((seconds, concurrency))
    return QueueLoad("q", known=True, live_workers=1, slots=slots, service=service, **load)


# retrieval: 1 batch of 0.05 s ahead, then its own = 0.1 s. generation: 8 slots held at 4 s a task
# and 4 waiting: it starts once 5 have finished (one every 4 s / 8), then takes 4 s = 6.5 s
R_OK = _served(0.05, waiting=1)
G_BUSY = _served(4.0, concurrency=8, slots=8, waiting=4, in_flight=8)


def _admission(snapshot: Snapshot | None, **settings: object) -> Admission:
    return Admission(Settings().replace(**settings).api, FakeMonitor(snapshot))  # type: ignore[arg-type]


def test_cold_start_admits() -> None:
    assert _admission(None).decide("rag", allow_degraded=True, deadline_s=1).action is Action.ADMIT
    cold = _snapshot(QueueLoad("retrieval"), QueueLoad("generation"))
    assert _admission(cold).decide("rag", allow_degraded=False, deadline_s=0.1).action is Action.ADMIT
    # work waiting, but no completion seen yet: the rate is unknown, so admit
    unknown = _snapshot(QueueLoad("retrieval", waiting=3), QueueLoad("generation", in_flight=5))
    assert _admission(unknown).decide("rag", allow_degraded=False, deadline_s=0.1).action is Action.ADMIT


def test_generation_too_slow_degrades_or_refuses() -> None:
    admission = _admission(_snapshot(R_OK, G_BUSY))
    assert admission.decide("rag", allow_degraded=True, deadline_s=10).action is Action.ADMIT
    degraded = admission.decide("rag", allow_degraded=True, deadline_s=5)
    assert (degraded.action, degraded.reason) == (Action.DEGRADE, "generation_busy")
    assert "Generation is busy" in degraded.message and "6.6 s" in degraded.message
    refused = admission.decide("rag", allow_degraded=False, deadline_s=5)
    assert (refused.action, refused.reason) == (Action.REJECT, "generation_busy")
    assert refused.retry_after_s == 2  # ceil(6.6 - 5)
    # retrieval-only requests do not wait for generation
    assert admission.decide("retrieval", allow_degraded=False, deadline_s=5).action is Action.ADMIT


def test_engines_on_more_gpus_admit_what_one_engine_would_degrade() -> None:
    """The same backlog of 48 tasks against one engine of 8 slots and against four (one per GPU,
    each its own live worker): about a quarter of the wait."""
    one = replace(G_BUSY, waiting=40, in_flight=8)
    four = replace(G_BUSY, waiting=16, in_flight=32, live_workers=4)
    assert one.depth == four.depth
    slow = _admission(_snapshot(R_OK, one)).decide("rag", allow_degraded=True, deadline_s=10)
    fast = _admission(_snapshot(R_OK, four)).decide("rag", allow_degraded=True, deadline_s=10)
    assert slow.action is Action.DEGRADE and fast.action is Action.ADMIT
    # It starts once the tasks past the slots have finished (41 past 8, one every 4 s / 8; 17 past
    # 32, one every 4 s / 32), then takes its own 4 s.
    assert one.predicted_wait_s() == pytest.approx(41 / 8 * 4 + 4)
    assert fast.wait_s == pytest.approx(0.1 + 17 / 32 * 4 + 4)


def test_nothing_waiting_admits_a_request_whose_own_time_fits() -> None:
    # The snapshot of issue 17: one lone answer in flight (of 8 slots), lone answers take ~14 s.
    lone = QueueLoad(
        "generation",
        in_flight=1,
        known=True,
        live_workers=1,
        slots=8,
        service=ServiceTimes.of((13.9, 1.0), (12.0, 1.0), (15.8, 1.0)),
    )
    admission = _admission(_snapshot(R_OK, lone))
    d = admission.decide("rag", allow_degraded=True, deadline_s=30.0)
    assert d.action is Action.ADMIT
    assert d.wait_s == pytest.approx(0.1 + 13.9)  # retrieval, then a free slot: its own mean time
    # Its own time past the deadline: degraded, whatever the queue.
    assert admission.decide("rag", allow_degraded=True, deadline_s=10.0).action is Action.DEGRADE


def test_decisions_carry_the_predicted_wait() -> None:
    admission = _admission(_snapshot(R_OK, G_BUSY))
    assert admission.decide("rag", allow_degraded=True, deadline_s=10).wait_s == pytest.approx(6.6)
    assert admission.decide("retrieval", allow_degraded=True, deadline_s=10).wait_s == pytest.approx(0.1)
    assert admission.decide("rag", allow_degraded=True, deadline_s=5).wait_s == pytest.approx(0.1)  # degraded
    assert _admission(None).decide("rag", allow_degraded=True, deadline_s=5).wait_s is None


def test_retrieval_too_slow_refuses_with_retry_after_from_the_predicted_wait() -> None:
    slow = _served(0.5, waiting=40, in_flight=1)  # 41 batches ahead, then its own: 21 s
    admission = _admission(_snapshot(slow, IDLE), retry_after_max_s=60)
    for mode in ("rag", "retrieval"):
        d = admission.decide(mode, allow_degraded=True, deadline_s=5)
        assert (d.action, d.reason, d.retry_after_s) == (Action.REJECT, "retrieval_busy", 16)
        assert "21.0 s" in d.message
    stalled = replace(_served(0.5, waiting=1), busy_s=600.0)  # nothing finished for 10 minutes
    d = _admission(_snapshot(stalled, IDLE), retry_after_max_s=30).decide(
        "rag", allow_degraded=True, deadline_s=5
    )
    assert (d.action, d.retry_after_s) == (Action.REJECT, 30)


def test_fixed_depth_limits() -> None:
    snap = _snapshot(
        QueueLoad("retrieval", waiting=5, known=False), QueueLoad("generation", waiting=3, known=False)
    )
    admission = _admission(snap, max_depth_generation=3)
    d = admission.decide("rag", allow_degraded=True, deadline_s=60)
    assert (d.action, d.reason) == (Action.DEGRADE, "generation_queue_full")
    admission = _admission(snap, max_depth_retrieval=5)
    d = admission.decide("retrieval", allow_degraded=True, deadline_s=60)
    assert (d.action, d.reason, d.retry_after_s) == (Action.REJECT, "retrieval_queue_full", 1)


def test_rag_requests_still_in_retrieval_count_against_generation() -> None:
    # generation, one slot at 1 s a task: 2 ahead + its own = 3 s; each RAG request admitted here
    # and not yet through retrieval (so not on the generation queue) adds 1 s, whatever the snapshot
    snap = _snapshot(IDLE, _served(1.0, in_flight=2))
    monitor = FakeMonitor(snap)
    admission = Admission(Settings().api, monitor)  # type: ignore[arg-type]
    outcomes = []
    for i in range(3):
        d = admission.decide("rag", allow_degraded=True, deadline_s=4.5)
        outcomes.append(d.action)
        if d.action is Action.ADMIT:
            admission.admitted("rag", f"r{i}")
    assert outcomes == [Action.ADMIT, Action.ADMIT, Action.DEGRADE]
    monitor.snapshot = _snapshot(IDLE, snap.load("generation"), at_ms=2)  # a new snapshot: still in transit
    assert admission.decide("rag", allow_degraded=True, deadline_s=4.5).action is Action.DEGRADE
    admission.retrieved("r0")  # its retrieval answered: generation's depth counts it from now on
    assert admission.decide("rag", allow_degraded=True, deadline_s=4.5).action is Action.ADMIT
    admission.admitted("retrieval", "r9")  # retrieval-only requests never reach generation
    assert admission.decide("rag", allow_degraded=True, deadline_s=4.5).action is Action.ADMIT


def test_requests_in_transit_are_forgotten_after_the_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _snapshot(IDLE, _served(1.0))
    admission = Admission(ApiSettings(request_timeout_s=10), FakeMonitor(snap))  # type: ignore[arg-type]
    admission.admitted("rag", "lost")  # an async job, say: nobody here watches its retrieval
    assert admission.decide("rag", allow_degraded=True, deadline_s=1.5).action is Action.DEGRADE
    later = time.monotonic() + 11
    monkeypatch.setattr("ragline.api.pipeline.admission.time.monotonic", lambda: later)
    assert admission.decide("rag", allow_degraded=True, deadline_s=1.5).action is Action.ADMIT


def test_stale_snapshot_or_admission_off_admits() -> None:
    snap = _snapshot(R_OK, G_BUSY)
    stale = Admission(ApiSettings(backpressure_stale_s=2), FakeMonitor(snap, age=3.0))  # type: ignore[arg-type]
    assert stale.decide("rag", allow_degraded=False, deadline_s=1).action is Action.ADMIT
    off = _admission(snap, admission_enabled=False)
    assert off.decide("rag", allow_degraded=False, deadline_s=1).action is Action.ADMIT


def test_a_slow_lone_generation_does_not_degrade_the_next_lone_request(redis_url: str) -> None:
    """Issue 17, on the real monitor: lone answers of ~14 s, then one running for 35 s with
    nothing queued. Each next lone request (30 s deadline) must be admitted, not degraded."""
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)
    queues = (RETRIEVAL_QUEUE, GENERATION_QUEUE)
    monitor = BackpressureMonitor(
        aioredis.Redis.from_url(redis_url), keys, queues, refresh_s=0.001, tau_s=5.0, heartbeat_ttl_s=6
    )
    admission = Admission(ApiSettings(), monitor)
    tag = f"adm-test-{uuid.uuid4().hex}"

    async def scenario() -> list[Action]:
        t = 1_000_000
        actions = []

        async def refresh() -> None:
            nonlocal t
            t += 250
            await asyncio.sleep(0.002)  # past the 1 ms lease
            await monitor.refresh(now_ms=t)

        for seconds in (14.0, 13.5, 14.5, 35.0):
            # A generation task of this many seconds in flight; nothing waits behind it.
            sync.hset("unacked", tag, json.dumps([{}, GENERATION_QUEUE, GENERATION_QUEUE]))
            for _ in range(int(seconds * 4)):
                await refresh()
                actions.append(admission.decide("rag", allow_degraded=True, deadline_s=30.0).action)
            sync.hdel("unacked", tag)
            pipe = sync.pipeline()
            count_done(pipe, keys, RETRIEVAL_QUEUE, 1, 0.01)
            count_done(pipe, keys, GENERATION_QUEUE, 1, seconds, concurrency=1.0, slots=8)
            pipe.execute()
            await refresh()
        return actions

    try:
        actions = asyncio.run(scenario())
    finally:
        sync.hdel("unacked", tag)
    assert Action.DEGRADE not in actions, f"{actions.count(Action.DEGRADE)} of {len(actions)} degraded"


def test_lone_requests_after_slow_lone_answers_get_full_answers(
    workers: Workers, settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    """Issue 17 replayed on the real stack: one client, one question at a time, nothing else
    queued. Every answer must be a full one, its predicted wait near what it took.

    The API's rate time constant is cut to 0.2 s so that this engine's answers of a second or so
    are as long against it as the deployed 10-30 s answers were against 5 s: with the rate in
    the prediction, that is what degraded them. (It feeds only the rate gauge now.)"""
    done_key = Keys(settings.redis.key_prefix).done(GENERATION_QUEUE)
    sync = redis.Redis.from_url(redis_url)
    before = sync.hgetall(done_key)
    api = start_api(settings.replace(service_rate_tau_s=0.2), tmp_path / "api.log")
    questions = ("When does Café Lumière open?", "What is the house speciality of Café Lumière?")
    answers = []
    try:
        with httpx.Client(base_url=api.base, timeout=120) as client:
            for i in range(12):
                # Unique queries: a result-cache hit would skip generation.
                reply = client.post("/v1/query", json={"query": f"{questions[i % 2]} (visit {i})"})
                assert reply.status_code == 200, reply.text
                answers.append(reply.json())
            # A stream's `done` carries the prediction too.
            with client.stream("POST", "/v1/query/stream", json={"query": f"{questions[0]} (stream)"}) as r:
                events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    finally:
        api.proc.stop()
    degraded = [a["notice"] for a in answers if a["degraded"]]
    assert not degraded, f"{len(degraded)} of {len(answers)} degraded: {degraded[0]}"
    assert all(a["answer"] and not a["cached"] for a in answers)
    predicted = [a["timings"]["predicted_wait_ms"] for a in answers]
    assert all(p is not None and p < 30_000 for p in predicted), predicted
    assert not events[-1].get("degraded") and events[-1].get("answer"), events[-1]
    assert events[-1]["timings"]["predicted_wait_ms"] < 30_000
    # The generation worker reports its slots, and that these tasks ran alone.
    after = sync.hgetall(done_key)
    assert int(after[b"slots"]) == settings.generation.max_num_seqs

    def added(name: bytes) -> float:
        return float(after[name]) - float(before.get(name, 0))

    # All in the lone bucket (service_times.py: concurrency 1).
    assert added(b"b0_tasks") == len(answers) + 1
    assert 0.99 <= added(b"b0_concurrency") / added(b"b0_tasks") < 1.5
    assert not any(name.endswith(b"_tasks") and added(name) for name in after if name != b"b0_tasks")


# -- what GET /v1/health/queues shows: the same numbers decide() reads ---------------------------


def test_the_view_shows_each_queue_with_the_wait_decisions_are_made_on() -> None:
    admission = _admission(_snapshot(R_OK, G_BUSY))
    view = admission.view()
    assert view.enabled and view.fresh and [q.queue for q in view.queues] == ["retrieval", "generation"]
    retrieval, generation = view.queue("retrieval"), view.queue("generation")
    assert retrieval is not None and generation is not None
    assert (retrieval.load.depth, generation.load.depth) == (1, 12)
    assert retrieval.predicted_wait_s == pytest.approx(0.1)
    assert view.rag_wait_s == pytest.approx(6.6)
    assert admission.decide("rag", allow_degraded=True, deadline_s=10).wait_s == pytest.approx(
        view.rag_wait_s
    )
    assert admission.decide("retrieval", allow_degraded=True, deadline_s=10).wait_s == pytest.approx(
        retrieval.predicted_wait_s
    )


def test_queue_health_shows_the_levels_the_prediction_is_read_from() -> None:
    lone_and_full = replace(G_BUSY, service=ServiceTimes.of((1.5, 1.0), (2.5, 1.0), (4.0, 8.0)))
    body = QueuesHealth.of(_admission(_snapshot(R_OK, lone_and_full)).view(), default_deadline_s=30)
    generation = next(q for q in body.queues if q.queue == "generation")
    assert generation.levels == [
        ServiceLevel(concurrency=1.0, task_s=2.0, tasks=2.0),
        ServiceLevel(concurrency=8.0, task_s=4.0, tasks=1.0),
    ]
    assert generation.task_s == 4.0  # at full concurrency (8 slots)


def test_the_view_counts_what_this_process_admitted_that_the_snapshot_cannot_show() -> None:
    snap = _snapshot(_served(0.05), _served(1.0, in_flight=2))
    admission = Admission(Settings().api, FakeMonitor(snap))  # type: ignore[arg-type]
    for i in range(2):
        admission.admitted("rag", f"r{i}")
    view = admission.view()
    generation = view.queue("generation")
    assert generation is not None and generation.not_yet_queued == 2
    assert generation.predicted_wait_s == pytest.approx(5.0)  # 2 in flight, 2 on their way, its own
    assert admission.decide("rag", allow_degraded=True, deadline_s=60).wait_s == pytest.approx(
        view.rag_wait_s
    )
    retrieval = view.queue("retrieval")
    assert retrieval is not None and retrieval.not_yet_queued == 2  # sent since this snapshot


def test_the_view_before_any_snapshot_and_when_stale_or_stalled() -> None:
    empty = _admission(None).view()
    assert empty.queues == () and not empty.fresh and empty.rag_wait_s == 0
    stale = Admission(ApiSettings(backpressure_stale_s=2), FakeMonitor(_snapshot(R_OK, G_BUSY), age=3.0))  # type: ignore[arg-type]
    assert not stale.view().fresh and stale.view().snapshot_age_s == 3.0
    stalled = replace(_served(0.5, waiting=1), busy_s=600.0)
    view = _admission(_snapshot(stalled, IDLE)).view()
    queue = view.queue("retrieval")
    assert queue is not None and queue.load.stalled and math.isinf(queue.predicted_wait_s)
    assert math.isinf(view.rag_wait_s)
    assert not _admission(_snapshot(R_OK, G_BUSY), admission_enabled=False).view().enabled
