"""The fault suite (issue 19): one run on this machine against a real stack, each scenario a
fault and the issue's pass condition for it.

    .venv/bin/python -m bench.faults [--only SCENARIO ...] [--soak-s 600] [--pool-s 30]
        [--memory-s 60] [--restart-s 30] [--fuzz-examples 25] [--capacity REQ_S]

The stack is what ``ragline up`` runs (API, retrieval, generation and callbacks workers; the
engine eager) on a redis-server of its own (a free port, AOF on), over pydoc's language topics
(ingested once into ``--home``); see bench/fault_stack.py. The scenarios, in order:

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
  → 0 responses 5xx but 503, 0 truncated 200 streams.
- ``soak_rss_growth``: ``--soak-s`` at half the measured full-RAG capacity → every process's RSS
  grows < 10%, 0 errors.

Prints a table, and last one JSON line with each scenario's figure (null where not run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from bench.fault_scenarios import SCENARIOS, Durations, Result, iter_selected
from bench.fault_stack import running


def table(results: list[Result]) -> str:
    mark = {True: "yes", False: "**no**", None: "n/a"}
    rows = ["| scenario | figure | pass | what was seen |", "|---|---|---|---|"]
    rows += [f"| {r.name} | {json.dumps(r.value)} | {mark[r.passed]} | {r.detail} |" for r in results]
    return "\n".join(rows)


def run_scenarios(stack, durations: Durations, only: list[str] | None) -> list[Result]:  # type: ignore[no-untyped-def]
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), metavar="SCENARIO")
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
    )
    started = time.monotonic()
    with running(args.home) as stack:
        print(
            f"stack ready in {time.monotonic() - started:.0f} s (logs in {stack.logs}; hung resolver: "
            f"{'yes' if stack.hung_resolver else 'no, needs root and unshare'})",
            flush=True,
        )
        results = run_scenarios(stack, durations, args.only)
    print()
    print(table(results))
    figures = {name: None for name in SCENARIOS} | {r.name: r.value for r in results}
    print(json.dumps(figures))
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
