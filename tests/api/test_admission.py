"""The admission policy on hand-made snapshots: admit, degrade, or 503 with Retry-After."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from api.admission import Action, Admission
from broker.backpressure import QueueLoad, Snapshot
from broker.settings import Settings


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
# retrieval: 1 batch ahead + its own at 20 batches/s = 0.1 s; generation: 12 ahead + its own at 2/s = 6.5 s
R_OK = QueueLoad("retrieval", waiting=1, rate=600, task_rate=20, known=True)
G_BUSY = QueueLoad("generation", waiting=4, in_flight=8, rate=2, task_rate=2, known=True)


def _admission(snapshot: Snapshot | None, **settings: object) -> Admission:
    return Admission(Settings(**settings), FakeMonitor(snapshot))  # type: ignore[arg-type]


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


def test_retrieval_too_slow_refuses_with_retry_after_from_the_predicted_wait() -> None:
    slow = QueueLoad("retrieval", waiting=40, in_flight=1, rate=20, task_rate=2, known=True)  # 21 s
    admission = _admission(_snapshot(slow, IDLE), retry_after_max_s=60)
    for mode in ("rag", "retrieval"):
        d = admission.decide(mode, allow_degraded=True, deadline_s=5)
        assert (d.action, d.reason, d.retry_after_s) == (Action.REJECT, "retrieval_busy", 16)
        assert "21.0 s" in d.message
    stalled = QueueLoad("retrieval", waiting=1, rate=0, task_rate=0, known=True)
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
    # generation: 2 ahead + its own at 1/s = 3 s; each RAG request admitted here and not yet
    # through retrieval (so not on the generation queue) adds 1 s, whatever the snapshot
    snap = _snapshot(IDLE, QueueLoad("generation", in_flight=2, rate=1, task_rate=1, known=True))
    monitor = FakeMonitor(snap)
    admission = Admission(Settings(), monitor)  # type: ignore[arg-type]
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
    snap = _snapshot(IDLE, QueueLoad("generation", rate=1, task_rate=1, known=True))
    admission = Admission(Settings(request_timeout_s=10), FakeMonitor(snap))  # type: ignore[arg-type]
    admission.admitted("rag", "lost")  # an async job, say: nobody here watches its retrieval
    assert admission.decide("rag", allow_degraded=True, deadline_s=1.5).action is Action.DEGRADE
    later = time.monotonic() + 11
    monkeypatch.setattr("api.admission.time.monotonic", lambda: later)
    assert admission.decide("rag", allow_degraded=True, deadline_s=1.5).action is Action.ADMIT


def test_stale_snapshot_or_admission_off_admits() -> None:
    snap = _snapshot(R_OK, G_BUSY)
    stale = Admission(Settings(backpressure_stale_s=2), FakeMonitor(snap, age=3.0))  # type: ignore[arg-type]
    assert stale.decide("rag", allow_degraded=False, deadline_s=1).action is Action.ADMIT
    off = _admission(snap, admission_enabled=False)
    assert off.decide("rag", allow_degraded=False, deadline_s=1).action is Action.ADMIT


@pytest.mark.parametrize(("header", "expected"), [(None, 30.0), (5000, 5.0), (1, 0.1), (10**9, 180.0)])
def test_deadline_header_is_clamped(header: int | None, expected: float) -> None:
    admission = _admission(None, default_deadline_ms=30_000, min_deadline_ms=100, max_deadline_ms=180_000)
    assert math.isclose(admission.deadline_s(header), expected)
