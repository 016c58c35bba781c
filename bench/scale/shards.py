"""bench/scale/run.py --shards: the whole scatter-gather through the API over 1, 2 and 4 shards of the
synthetic corpus, against one unsharded worker, on real processes (issue 21, item 4).

Served as deploy/k8s serves shards, all of it up at once on this machine: one API (uvicorn); one
coordinating retrieval worker (``ragline worker retrieval --shards none``) that takes every
batch, embeds its queries with MiniLM, searches a plain index itself (the unsharded baseline:
for a plain index it is the default worker) and asks each shard of a sharded index over the
shard's queue; and shard workers as deploy/k8s's shard groups, worker j holding shard j of
every sharded index (``--shards scale1:0,scale2:0,scale4:0`` for j = 0). So the shards of one
index are searched in parallel by as many processes, as they would be on machines of their own
(here 4 processes share 2 cores), and, since one client sends one query at a time, the indexes
never wait on each other's workers. One process per shard rather than one for all of them: a
solo worker serving every shard queue would search the shards one after the other, which is
no deployment's reason to shard. Not measured: the default worker (``--shards all``) searching
every shard in process, one host's way to serve a sharded index (docs/operations.md).

Queries: text through ``POST /v1/query`` with mode ``retrieval``, dense (the workers'
RAGLINE_RETRIEVAL_MODE: the placeholder chunk texts give BM25 nothing to find), each text used
once (the result and embedding caches never answer): the coordinator embeds it and searches
the synthetic vectors, so the results mean nothing and the latency is real. The configurations
take turns, every round in a new order, because a shared machine's speed drifts over minutes:
all four see the same stretches of it. Latency is the client's, from sending to the whole
answer, one request at a time, after untimed warm-up rounds; an answer that left a shard out
(``partial``) or failed is counted apart, not timed. Redis: a database of its own, flushed at
the start and at the end.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys

from bench.env import settings_env
from bench.scale.data import Corpus
from bench.scale.shards_index import (
    PLAIN,
    SHARD_COUNTS,
    build_command,
    built_times,
    register_all,
    served_home,
    sharded_name,
)
from ragline.processes import Supervisor, free_port

CONFIGS = (PLAIN, *(sharded_name(c) for c in SHARD_COUNTS))
_BUILD_TIMEOUT_S = 6 * 3600  # 1M: the plain HNSW index (unless cached) and two sharded copies
_READY_TIMEOUT_S = 1800  # every worker reading its indexes (1M vectors, 1M chunks) on a busy box
# User-like questions of a few lengths; a round's suffix makes each text unique.
QUESTIONS = (
    "What does the global statement do?",
    "How do I read a file line by line?",
    "Explain list comprehensions briefly.",
    "What is the difference between a tuple and a list?",
    "How are exceptions chained?",
    "When should I use a dataclass instead of a dict?",
    "What does asyncio.gather return?",
    "How do I sort a dictionary by value?",
)


@dataclass(frozen=True)
class Latency:
    timed: int
    p50_ms: float
    p99_ms: float
    partial: int = 0
    errors: int = 0


@dataclass(frozen=True)
class ShardRun:
    n: int
    latency: dict[str, Latency]  # by configuration (index name)
    build_s: dict[str, float]
    cached: bool

    @property
    def shards4_over_1_p99(self) -> float:
        return self.latency[sharded_name(4)].p99_ms / self.latency[PLAIN].p99_ms


def label(name: str) -> str:
    if name == PLAIN:
        return "unsharded"
    count = int(name.removeprefix(PLAIN))
    return f"{count} shard{'s' if count > 1 else ''}"


def worker_selections(counts: Sequence[int]) -> list[str]:
    """Each shard worker's ``--shards``: worker j holds shard j of every index that has one."""
    return [
        ",".join(f"{sharded_name(c)}:{j}" for c in counts if j < c) for j in range(max(counts, default=0))
    ]


def schedule(rounds: int, names: Sequence[str], *, seed: int = 0) -> list[tuple[int, str]]:
    """(round, configuration): each round asks every configuration once, in a shuffled order, so
    that none always follows the same one (a worker just busy, a cache just warmed)."""
    rng = random.Random(seed)
    order = []
    for r in range(rounds):
        names_now = list(names)
        rng.shuffle(names_now)
        order += [(r, name) for name in names_now]
    return order


def query_text(round_no: int, name: str) -> str:
    """Unique per round and configuration, the same question (and length) for all of a round."""
    question = QUESTIONS[round_no % len(QUESTIONS)]
    return f"{question} (case {round_no}-{CONFIGS.index(name)})"


def summarize(seconds: Sequence[float], *, partial: int = 0, errors: int = 0) -> Latency:
    if not seconds:
        return Latency(0, float("nan"), float("nan"), partial, errors)
    p50, p99 = np.percentile(np.asarray(seconds) * 1000, [50, 99])
    return Latency(len(seconds), float(p50), float(p99), partial, errors)


def table(run: ShardRun) -> str:
    base = run.latency[PLAIN].p99_ms
    lines = [
        f"| shards ({run.n:,} vectors, through the API) | queries timed | P50 ms | P99 ms "
        "| P99 over unsharded | partial / failed | build s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in CONFIGS:
        lat = run.latency[name]
        built = run.build_s.get(name)
        lines.append(
            f"| {label(name)} | {lat.timed} | {lat.p50_ms:.1f} | {lat.p99_ms:.1f} | {lat.p99_ms / base:.2f} "
            f"| {lat.partial} / {lat.errors} "
            f"| {'-' if built is None else f'{built:.0f}'}{' (cached)' if run.cached else ''} |"
        )
    return "\n".join(lines)


@contextmanager
def served(settings: Settings, logs: Path) -> Iterator[str]:
    """The API, the coordinator and the shard workers, up until the block ends; the API's URL."""
    port = free_port()
    env = settings_env(settings.replace(api_port=port))
    ragline = [sys.executable, "-m", "ragline"]
    commands = {
        "coordinator": [*ragline, "worker", "retrieval", "--shards", "none"],
        **{
            f"shard-worker-{j}": [*ragline, "worker", "retrieval", "--shards", selection]
            for j, selection in enumerate(worker_selections(SHARD_COUNTS))
        },
        "api": [*ragline, "api"],
    }
    logs.mkdir(parents=True, exist_ok=True)
    with Supervisor() as supervisor:
        for name, cmd in commands.items():
            with open(logs / f"{name}.log", "wb") as log:
                supervisor.start(name, cmd, env, stdout=log)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(supervisor, url, logs)
        yield url


def _body(text: str, name: str) -> dict[str, str]:
    return {"query": text, "mode": "retrieval", "index": name}


def _wait_ready(supervisor: Supervisor, url: str, logs: Path) -> None:
    """Until every configuration answers whole (every shard's worker live and loaded)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    pending = list(CONFIGS)
    with httpx.Client(base_url=url, timeout=60) as client:
        while pending:
            if (child := supervisor.exited()) is not None:
                raise RuntimeError(f"{child.name} exited early (its log: {logs / child.name}.log)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(pending)} not answering whole in time (logs: {logs})")
            try:
                reply = client.post("/v1/query", json=_body(f"ready? {time.time_ns()}", pending[0]))
                if reply.status_code == 200 and not reply.json().get("partial"):
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.5)


def run_queries(url: str, rounds: int, warm_up: int, *, seed: int) -> dict[str, Latency]:
    """``warm_up`` untimed rounds, then ``rounds`` timed ones, one request at a time."""
    took: dict[str, list[float]] = {name: [] for name in CONFIGS}
    partial = dict.fromkeys(CONFIGS, 0)
    errors = dict.fromkeys(CONFIGS, 0)
    with httpx.Client(base_url=url, timeout=60) as client:
        for round_no, name in schedule(warm_up + rounds, CONFIGS, seed=seed):
            started = time.perf_counter()
            try:
                reply = client.post("/v1/query", json=_body(query_text(round_no, name), name))
            except httpx.HTTPError:
                reply = None
            seconds = time.perf_counter() - started
            if round_no < warm_up:
                continue
            if reply is None or reply.status_code != 200:
                errors[name] += 1
            elif reply.json().get("cached"):
                raise RuntimeError("a cached answer: the queries were meant to be unique")
            elif reply.json().get("partial"):
                partial[name] += 1
            else:
                took[name].append(seconds)
    return {name: summarize(took[name], partial=partial[name], errors=errors[name]) for name in CONFIGS}


def measure(
    root: Path,
    corpus: Corpus,
    settings: Settings,
    *,
    rounds: int,
    warm_up: int,
    redis_url: str,
    seed: int = 0,
) -> ShardRun:
    """Build (or take from the cache) the indexes, serve them, and time ``rounds`` rounds."""
    home = served_home(root, corpus, settings.retrieval)
    cached = all(name in built_times(home) for name in CONFIGS)
    print(f"shards: indexes of {corpus.n:,} vectors {'(cached)' if cached else '(building)'}", flush=True)
    subprocess.run(build_command(root, corpus), timeout=_BUILD_TIMEOUT_S, check=True)
    settings = settings.replace(
        home=home,
        redis_url=redis_url,
        default_index=PLAIN,
        retrieval_mode="dense",
        auth_enabled=False,
        rate_limit_enabled=False,
    )
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        register_all(client, Keys(settings.redis.key_prefix), settings.indexes_dir)
        print("shards: starting the API, the coordinator and the shard workers", flush=True)
        with served(settings, home / "logs") as url:
            print(f"shards: {rounds} rounds of {len(CONFIGS)} queries, one at a time", flush=True)
            latency = run_queries(url, rounds, warm_up, seed=seed)
    finally:
        client.flushdb()
    return ShardRun(corpus.n, latency, built_times(home), cached)
