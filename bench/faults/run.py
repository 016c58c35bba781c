"""The fault suite (issue 19): one run on this machine against a real stack, each scenario a
fault and the issue's pass condition for it.

    .venv/bin/python -m bench.faults [--only SCENARIO ...] [--soak-s 600] [--pool-s 30]
        [--memory-s 60] [--restart-s 30] [--fuzz-examples 25] [--capacity REQ_S]
        [--ingest-queries 200] [--fair-jobs 100]

The stack is what ``ragline up`` runs (API, retrieval, generation, callbacks and ingest workers; the
engine eager) on a redis-server of its own (a free port, AOF on), over pydoc's language topics
(ingested once into ``--home``); see bench/faults/stack.py. The scenarios, in order:

- ``chunked_413``: a 10 MB chunked body to ``/v1/query``, ``/v1/query/stream`` and ``/v1/jobs``
  → 413 each, and the API's RSS grows < 10 MiB.
- ``cross_key_bytes``: key B resumes, reads and cancels key A's request and job ids, while they
  run and after → 404 each, 0 bytes of A's events.
- ``pool_exhaustion_success``: key 1 holds 600 resumes of a job of its own that stays open (its
  retrieval worker paused) while key 2 sends cache hits for ``--pool-s`` → key 2's success
  ≥ 99.9%, its P99 ≤ 2× unloaded.
- ``redis_memory_levels_off``: Redis at ``maxmemory 64mb``, unique ``top_k=50`` queries and jobs
  at a default key's allowed rate for ``--memory-s`` → ``used_memory`` levels off < 80% of the
  limit, and every second some request gets a 2xx.
- ``redis_restart_lost_jobs``: Redis SIGKILLed and restarted (AOF) under jobs with webhooks,
  queries and streams → 0 accepted jobs lost, 0 duplicate deliveries, 0 responses 5xx but 503;
  the seconds until the API answers again.
- ``worker_kill_stream_ok``: the generation worker SIGKILLed while SSE clients are mid-answer →
  each gets one final ``done``, its tokens after the last ``restart`` equal ``done.answer``.
- ``hostile_webhooks_p99_s``: 20 receivers trickling a byte every 9 s and webhooks behind a
  resolver that never answers (needs root for the namespaces) → a normal job's webhook arrives
  within 15 s.
- ``fuzz_5xx``: schemathesis over every operation of the OpenAPI schema, with hostile headers
  (the document endpoints half the time on an index the key may write), then uploads of hostile
  shape, multipart and JSON (names, ids, nested metadata, wrong types) → 0 responses 5xx but 503,
  0 truncated 200 streams, 0 accepted uploads that their ingest job fails with a 5xx.
- ``soak_rss_growth``: ``--soak-s`` at half the measured full-RAG capacity → every process's RSS
  grows < 10%, 0 errors.
- ``redis_primary_killed``: on a stack of its own whose Redis is a Sentinel set (``ragline up
  --ha``'s), the primary SIGKILLed under jobs with webhooks, queries and streams from several
  keys, twice (the old primary back as a replica in between) → answered again ≤ 10 s after the
  kill, 0 accepted jobs lost, 0 duplicate webhooks, every cut stream resumed to a final event,
  0 responses 5xx but 503 (bench/faults/failover.py; ``--restart-s`` per round).
- ``ingest_quadratic_p99_ratio``: a key asks ``--ingest-queries`` retrieval questions one at a
  time, then as many again while another key uploads, one after another, Markdown documents whose
  heading line is 16 MiB of spaces (a shape once quadratic to read) → its P99 beside the uploads
  ≤ 1.5× its P99 before.
- ``ingest_fair_jobs``: one key queues ``--fair-jobs`` uploads, then another key uploads one →
  its upload done within 2 jobs' time (its wait over one job's median run).

Prints a table, and last one JSON line with each scenario's figure (null where not run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from bench.faults.failover import primary_killed
from bench.faults.scenarios import SCENARIOS, Durations, Result, iter_selected
from bench.faults.stack import running


def table(results: list[Result]) -> str:
    mark = {True: "yes", False: "**no**", None: "n/a"}
    rows = ["| scenario | figure | pass | what was seen |", "|---|---|---|---|"]
    rows += [f"| {r.name} | {json.dumps(r.value)} | {mark[r.passed]} | {r.detail} |" for r in results]
    return "\n".join(rows)


def run_scenarios(stack, durations: Durations, only: list[str] | None) -> list[Result]:
    """Each selected scenario in turn; one that raises is reported as failed, and the processes
    a fault left dead or hung are started again before the next."""
    results: list[Result] = []
    for name, scenario in iter_selected(only):
        began = time.monotonic()
        print(f"{name} ...", flush=True)
        try:
            result = scenario(stack, durations)
        except Exception as exc:
            traceback.print_exc()
            result = Result(name, None, False, f"raised {type(exc).__name__}: {exc}"[:300])
        print(f"  {result.detail} ({time.monotonic() - began:.0f} s)", flush=True)
        results.append(result)
        revived = stack.heal()
        if revived:
            print(f"  started again: {', '.join(revived)}", flush=True)
    return results


FAILOVER = "redis_primary_killed"
FAILOVER_FIGURES = (
    "failover_unavailable_s",
    "failover_lost_accepted_jobs",
    "failover_duplicate_webhooks",
    "failover_streams_resumed",
    "failover_streams_interrupted",
    "failover_streams_spanning",
    "failover_stream_gaps",
    "failover_500s",
)


def _failover(home: Path, durations: Durations) -> Result:
    """``redis_primary_killed`` on a stack of its own, on a Sentinel set."""
    print(f"{FAILOVER} ...", flush=True)
    began = time.monotonic()
    try:
        with running(home, sentinel=True, hung_resolver=False) as stack:
            result = primary_killed(stack, durations)
    except Exception as exc:
        traceback.print_exc()
        result = Result(FAILOVER, None, False, f"raised {type(exc).__name__}: {exc}"[:300])
    print(f"  {result.detail} ({time.monotonic() - began:.0f} s)", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=[*SCENARIOS, FAILOVER], metavar="SCENARIO")
    defaults = Durations()
    parser.add_argument("--pool-s", type=float, default=defaults.pool_s)
    parser.add_argument("--memory-s", type=float, default=defaults.memory_s)
    parser.add_argument("--restart-s", type=float, default=defaults.restart_s)
    parser.add_argument("--soak-s", type=float, default=defaults.soak_s)
    parser.add_argument(
        "--fuzz-examples", type=int, default=defaults.fuzz_examples, help="per operation and mode"
    )
    parser.add_argument("--stream-clients", type=int, default=defaults.stream_clients)
    parser.add_argument("--capacity", type=float, help="full-RAG req/s for the soak (else measured)")
    parser.add_argument("--ingest-queries", type=int, default=defaults.ingest_queries)
    parser.add_argument("--fair-jobs", type=int, default=defaults.fair_jobs)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-faults")
    args = parser.parse_args()
    durations = Durations(
        pool_s=args.pool_s,
        memory_s=args.memory_s,
        restart_s=args.restart_s,
        soak_s=args.soak_s,
        fuzz_examples=args.fuzz_examples,
        stream_clients=args.stream_clients,
        capacity=args.capacity,
        ingest_queries=args.ingest_queries,
        fair_jobs=args.fair_jobs,
    )
    started = time.monotonic()
    results: list[Result] = []
    if not args.only or set(args.only) - {FAILOVER}:
        with running(args.home) as stack:
            print(
                f"stack ready in {time.monotonic() - started:.0f} s (logs in {stack.logs}; hung resolver: "
                f"{'yes' if stack.hung_resolver else 'no, needs root and unshare'})",
                flush=True,
            )
            results = run_scenarios(stack, durations, args.only)
    if not args.only or FAILOVER in args.only:
        results.append(_failover(args.home, durations))
    print()
    print(table(results))
    figures: dict[str, object] = {name: None for name in SCENARIOS} | {r.name: r.value for r in results}
    # The failover's figures, each under its own name (null where not run).
    measured = figures.pop(FAILOVER, None)
    figures |= {name: None for name in FAILOVER_FIGURES} | (measured if isinstance(measured, dict) else {})
    print(json.dumps(figures))
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
