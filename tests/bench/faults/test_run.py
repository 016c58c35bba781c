"""bench/faults/run.py: every scenario but the soak, at short durations, on one real stack of the
bench's own (its own redis-server, the three workers and the API); and its report's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults.run import FAILOVER_FIGURES, table
from bench.faults.scenarios import SCENARIOS, Durations, Result, Stream

ISSUE_KEYS = {
    "chunked_413",
    "cross_key_bytes",
    "pool_exhaustion_success",
    "redis_memory_levels_off",
    "redis_restart_lost_jobs",
    "worker_kill_stream_ok",
    "hostile_webhooks_p99_s",
    "fuzz_5xx",
    "soak_rss_growth",
    "ingest_quadratic_p99_ratio",
    "ingest_fair_jobs",
}
SHORT = Durations(pool_s=10, memory_s=30, restart_s=15, fuzz_examples=4, stream_clients=2, ingest_queries=100)


def test_the_json_line_has_exactly_the_issues_keys() -> None:
    assert set(SCENARIOS) == ISSUE_KEYS
    # Issue 34's, from the failover scenario on a Sentinel set (bench/faults/failover.py).
    assert {
        "failover_unavailable_s",
        "failover_lost_accepted_jobs",
        "failover_duplicate_webhooks",
        "failover_streams_resumed",
        "failover_500s",
    } <= set(FAILOVER_FIGURES)


def test_table_marks_pass_fail_and_not_measured() -> None:
    rows = table([Result("a", 0, True, "x"), Result("b", 0.5, False, "y"), Result("c", None, None, "z")])
    assert "| a | 0 | yes | x |" in rows and "| b | 0.5 | **no** | y |" in rows
    assert "| c | null | n/a | z |" in rows


def test_joined_tokens_start_again_after_a_restart() -> None:
    stream = Stream(200, [("token", {"text": "Hel"}), ("restart", {}), ("token", {"text": "Hi"})])
    stream.events.append(("done", {"answer": "Hi"}))
    assert stream.joined() == "Hi" and stream.finals == ["done"] and stream.tokens == 2


@pytest.fixture(scope="module")
def stack(prepared_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from bench.faults.stack import running

    with running(tmp_path_factory.mktemp("faults-home")) as started:
        yield started


def _run(stack: object, name: str) -> Result:
    result = SCENARIOS[name](stack, SHORT)  # type: ignore[arg-type]
    stack.heal()  # type: ignore[attr-defined]
    return result


needs_stack = [pytest.mark.integration, pytest.mark.vllm]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("chunked_413", marks=needs_stack),
        pytest.param("cross_key_bytes", marks=needs_stack),
        pytest.param("worker_kill_stream_ok", marks=needs_stack),
        pytest.param("fuzz_5xx", marks=needs_stack),
        pytest.param("redis_restart_lost_jobs", marks=needs_stack),
        pytest.param("pool_exhaustion_success", marks=needs_stack),
        pytest.param("redis_memory_levels_off", marks=needs_stack),
        pytest.param(
            "ingest_quadratic_p99_ratio",
            marks=[
                *needs_stack,
                # Reading stays linear (each hostile job runs in seconds) and every question is
                # answered, but on two shared cores the uploads' other work (the API taking 16 MiB,
                # the ingest worker's parse) displaces one of the encoder's OpenMP threads and still
                # moves another key's P99 past 1.5x: a figure of the benchmark, not yet a guarantee
                # (docs/performance.md, Faults).
                pytest.mark.xfail(strict=False, reason="P99 beside 16 MiB uploads on 2 shared cores"),
            ],
        ),
        pytest.param("ingest_fair_jobs", marks=needs_stack),
    ],
)
def test_scenario_holds(stack: object, name: str) -> None:
    result = _run(stack, name)
    assert result.passed, result.detail


@pytest.mark.integration
@pytest.mark.vllm
def test_hostile_webhooks_leave_a_normal_one_on_time(stack: object) -> None:
    result = _run(stack, "hostile_webhooks_p99_s")
    # Without root (no hung resolver) only the trickling receivers are there: the bound holds too.
    assert result.value is not None and result.value <= 15.0, result.detail


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.slow  # a stack of its own on a Sentinel set, two failovers
def test_the_primary_killed_twice_loses_no_accepted_job(
    prepared_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from bench.faults.failover import primary_killed
    from bench.faults.stack import running

    with running(tmp_path_factory.mktemp("failover-home"), sentinel=True, hung_resolver=False) as ha_stack:
        result = primary_killed(ha_stack, SHORT)
    print(result.value, result.detail)  # the figures, for whoever runs it with -s
    assert result.passed, result.detail
