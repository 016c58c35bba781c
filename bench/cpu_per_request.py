"""Where a request's CPU goes: milliseconds of CPU per request in each process of the retrieval
stack (the API, the retrieval worker, Redis, the load generator), cold and warm. A diagnostic.

    .venv/bin/python -m bench.cpu_per_request [--docs DIR] [--duration 20] [--queries-file F]

The stack is bench/retrieval.py's own (one API, one retrieval worker, keys and rate limits off),
on the index that benchmark ingests; wrk drives it with retrieval-only queries, unique (cold) at
1 and 64 clients, then cycling through 200 cached ones (warm). Each process's CPU time is read
before and after each load and divided by the requests answered; ``busy`` is all of it over the
wall time (2.0: both cores of a 2-core box). When a load is CPU-bound, req/s moves inversely with
the total, so a change that costs throughput shows here as the process that pays for it.

To compare two commits, run it from the other checkout's root with this file's path
(``cd OLD && PYTHONPATH=. python /path/to/bench/cpu_per_request.py --home H2 --queries-file Q``):
that checkout's stack, this accounting. Give both the same ``--queries-file`` (one query a
line): the load's questions come from the index's section titles, which change with the
chunker, and longer questions cost the encoder more. ``--write-queries F`` saves this one's.
Extra settings for the stack: ``--set retrieval_mode=dense --set key_max_requests=0``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path.cwd()))  # run from another checkout's root: its bench, broker, ragline

from ragline.broker.config.settings import Settings

from bench import retrieval
from bench.env import settings_env
from ragline.processes import free_port

RETRIEVAL_ONLY = ', "mode": "retrieval"'


@dataclass(frozen=True)
class Sample:
    """CPU seconds used so far by each process of the stack, and when read."""

    cpu_s: dict[str, float]
    at: float


def per_request(before: Sample, after: Sample, requests: int) -> dict[str, float]:
    """Each process's CPU ms per request between two samples, and the cores all of them kept busy."""
    n = max(requests, 1)
    used = {name: after.cpu_s[name] - before.cpu_s.get(name, 0.0) for name in after.cpu_s}
    out = {f"{name}_ms": round(s * 1000 / n, 3) for name, s in used.items()}
    out["busy"] = round(sum(used.values()) / max(after.at - before.at, 1e-9), 2)
    return out


class Processes:
    """The stack's processes (children of this one, by their command line), Redis and wrk."""

    def __init__(self) -> None:
        self._named: dict[str, list[psutil.Process]] = {"api": [], "worker": [], "redis": []}
        for p in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "uvicorn" in cmd or "ragline api" in cmd:
                self._named["api"].append(p)
            elif "celery" in cmd or "worker" in cmd:
                self._named["worker"].append(p)
        self._named["redis"] = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"]

    def sample(self) -> Sample:
        cpu: dict[str, float] = {name: sum(_cpu_s(p) for p in ps) for name, ps in self._named.items()}
        me = psutil.Process().cpu_times()
        cpu["wrk"] = me.children_user + me.children_system  # wrk is a child this process waited for
        return Sample(cpu, time.perf_counter())


def _cpu_s(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:  # it exited: its time is gone with it
        return 0.0
    return t.user + t.system


def measure(load: retrieval.Load, procs: Processes, connections: int, duration: float) -> dict[str, float]:
    before = procs.sample()
    result = load.run(connections, duration)
    after = procs.sample()
    return {
        "rps": round(result.rps, 1),
        "p50_ms": round(result.p50_ms, 2),
        "p99_ms": round(result.p99_ms, 1),
        "errors": result.errors,
        **per_request(before, after, result.requests),
    }


def _settings(args: argparse.Namespace) -> Settings:
    options: dict[str, Any] = dict(
        home=args.home,
        redis_url=args.redis_url,
        default_index=retrieval.INDEX,
        torch_threads=2,
        auth_enabled=False,
        rate_limit_enabled=False,
    )
    if hasattr(Settings, "replace"):
        return Settings().replace(**options)
    return Settings(**options)  # an older checkout's flat Settings


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=Path, default=retrieval.DEFAULT_DOCS)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds at 64 clients; half that else")
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--queries-file", type=Path, help="the load's questions, one a line")
    parser.add_argument("--write-queries", type=Path, help="save this index's questions here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a stack setting")
    args = parser.parse_args()
    if not args.docs.exists():
        raise SystemExit(f"{args.docs} not found: apt-get install python3.11-doc")

    settings = _settings(args)
    retrieval.ensure_index(settings, args.docs)
    queries = retrieval.load_queries(settings)
    if args.write_queries:
        args.write_queries.write_text("\n".join(queries) + "\n")
    if args.queries_file:
        queries = [q for q in args.queries_file.read_text().splitlines() if q.strip()]
    prefix = retrieval.fresh_prefix(settings)
    port = free_port()
    env = settings_env(settings)
    env.update(RAGLINE_API_PORT=str(port), RAGLINE_KEY_PREFIX=prefix)
    for item in args.set:
        name, _, value = item.partition("=")
        env[f"RAGLINE_{name.upper()}"] = value
    report: dict[str, object] = {"queries": len(queries), "settings": args.set}
    try:
        server = retrieval._start(
            [
                [sys.executable, "-m", "ragline", "worker", "retrieval"],
                [sys.executable, "-m", "ragline", "api"],
            ],
            env,
            f"http://127.0.0.1:{port}",
            {"query": "warm up", "mode": "retrieval"},
        )
        try:
            procs = Processes()
            cold = retrieval.Load(server.url, queries, unique=True, extra=RETRIEVAL_ONLY)
            cold.warm_up()
            report["cold_1"] = measure(cold, procs, 1, args.duration / 2)
            report["cold_64"] = measure(cold, procs, 64, args.duration)
            warm_set = queries[:200]
            retrieval.warm_cache(server.url, warm_set)
            warm = retrieval.Load(server.url, warm_set, unique=False, extra=RETRIEVAL_ONLY)
            report["warm_1"] = measure(warm, procs, 1, args.duration / 2)
            report["warm_64"] = measure(warm, procs, 64, args.duration / 2)
        finally:
            server.stop()
    finally:
        retrieval.forget_prefix(settings, prefix)
    print("| load | req/s | P50 ms | P99 ms | API | worker | Redis | wrk (ms CPU / request) | busy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("cold_1", "cold_64", "warm_1", "warm_64"):
        r = report[name]
        assert isinstance(r, dict)
        print(
            f"| {name} | {r['rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['api_ms']} | {r['worker_ms']} "
            f"| {r['redis_ms']} | {r['wrk_ms']} | {r['busy']} |"
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
