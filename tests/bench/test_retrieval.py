"""The lone runs take turns between the servers, and their slices combine into one row each."""

from __future__ import annotations

from bench.loadgen import LoadResult
from bench.retrieval import Load, interleaved


class _Scripted(Load):
    """A load whose slices return set results and log the turn they ran in (no wrk, no server)."""

    def __init__(self, name: str, results: list[LoadResult], turns: list[str]) -> None:
        super().__init__(url=name, queries=[], unique=True)
        self._results = iter(results)
        self._turns = turns

    def run(self, connections: int, duration_s: float) -> LoadResult:
        self._turns.append(self.url)
        return next(self._results)


def _slice(requests: int, rps: float, p50: float, p99: float) -> LoadResult:
    return LoadResult(connections=1, requests=requests, rps=rps, p50_ms=p50, p99_ms=p99, errors=0)


def test_slices_alternate_and_combine() -> None:
    turns: list[str] = []
    a = _Scripted(
        "a",
        [_slice(100, 50.0, 10.0, 30.0), _slice(300, 150.0, 12.0, 20.0), _slice(200, 100.0, 11.0, 90.0)],
        turns,
    )
    b = _Scripted("b", [_slice(40, 20.0, 20.0, 25.0)] * 3, turns)

    rows = interleaved({"a": a, "b": b}, connections=1, duration=6, slices=3)

    assert turns == ["a", "b", "a", "b", "a", "b"]
    assert rows["a"].requests == 600
    assert rows["a"].rps == 600 / 6.0  # every slice took 2 s
    assert rows["a"].p50_ms == 11.0  # the median slice
    assert rows["a"].p99_ms == 90.0  # the worst slice
    assert rows["b"].rps == 20.0
