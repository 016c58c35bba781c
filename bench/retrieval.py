"""Retrieval under load: ragline's path vs the naive path, side by side, in one run.

    .venv/bin/python -m bench.retrieval [--docs /usr/share/doc/python3.11/html/_sources] [--duration 10]

Corpus: the Python 3.11 docs (Debian's python3.11-doc), chunked and ingested once (cached in
RAGLINE_HOME; embeddings cached in Redis). Load: questions about the corpus's section titles,
each made unique per request for the cold runs. wrk (one thread) drives each server at 1, 16 and 64
connections: the loaded runs one server at a time, the lone (1-client) runs of the naive path and
ragline taking turns in short slices, both servers up. Also measured: the floor for any cache
hit (one Redis GET behind the same framework), the ceiling (one process encoding and searching 64
queries as one batch, timed beside ragline's 64-client run), and recall@10 / MRR@10 on the FAQ
question → section labels for HNSW and IVF-PQ with refine against exact search, and the default
retrieval mode (hybrid) against dense-only at 64 clients: a ragline stack for each, started in
turn, twice (``--modes-only`` runs just that). The last line printed is one JSON object with the
headline ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from ragline.broker.config.settings import Settings

from bench.env import settings_env
from bench.loadgen import LoadResult, escape_query, run_wrk
from ragline.processes import Supervisor, free_port, interrupt_on_signals

CONCURRENCY = (1, 16, 64)
DEFAULT_DOCS = Path("/usr/share/doc/python3.11/html/_sources")
INDEX = "pydocs"


@dataclass
class Server:
    supervisor: Supervisor
    url: str

    def stop(self) -> None:
        self.supervisor.stop()


def _start(cmds: list[list[str]], env: dict[str, str], url: str, probe: dict[str, object]) -> Server:
    server = Server(Supervisor(), url)
    for cmd in cmds:
        server.supervisor.start(" ".join(cmd[1:]), cmd, env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.supervisor.exited() is not None:
            server.stop()
            raise RuntimeError(f"a server for {url} exited early: {cmds}")
        try:
            # A fresh query each time: a cached answer would say nothing about the workers.
            fresh = {**probe, "query": f"{probe['query']} {time.time_ns()}"}
            if httpx.post(url + "/v1/query", json=fresh, timeout=10).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"{url} did not answer in time")


def ensure_index(settings: Settings, docs: Path, *, index: str = INDEX) -> None:
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.ingest import ingest

    client, keys = sync_client(settings.redis), Keys(settings.redis.key_prefix)
    if indexes.lookup(client, keys, index) is None:
        for info in index_store.current_on_disk(settings.indexes_dir):
            indexes.register(client, keys, info)
    if indexes.lookup(client, keys, index) is None:
        print(f"ingesting {docs} (once; embeddings are cached)", flush=True)
        ingest(settings, [docs], index_name=index)


def fresh_prefix(settings: Settings) -> str:
    """A new Redis key prefix with the bench's index registered under it."""
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes

    client = sync_client(settings.redis)
    info = indexes.lookup(client, Keys(settings.redis.key_prefix), INDEX)
    assert info is not None
    prefix = f"ragline-bench-{os.urandom(4).hex()}"
    indexes.register(client, Keys(prefix), info)
    return prefix


def forget_prefix(settings: Settings, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis.redis_url)
    batch = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch = []
    if batch:
        client.delete(*batch)


def faq_labels(docs: Path) -> list[tuple[str, str, str]]:
    """(question, source, section anchor) for every FAQ section whose title is a question."""
    from ragline.workers.retrieval.readers import read_sections

    labels = []
    for path in sorted((docs / "faq").glob("*.rst.txt")):
        for section in read_sections(path):
            if section.title.endswith("?"):
                labels.append((section.title, str(path), section.anchor))
    return labels


_ROLE = re.compile(r":[a-z:]+:`!?([^`]*)`")
_FORMS = ("What is {}?", "How do I use {}?", "Explain {} briefly.", "Tell me about {}.", "{} in Python?")


def load_queries(settings: Settings, *, index: str = INDEX, seed: int = 0) -> list[str]:
    """Distinct user-like questions: three phrasings of every section title of the corpus.

    Questions about what the docs cover, as users ask them (5-15 tokens), rather than fragments
    of the chunks' text, which are longer, encode several times slower and so would measure a workload
    no RAG front end sees.
    """
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes

    info = indexes.lookup(sync_client(settings.redis), Keys(settings.redis.key_prefix), index)
    assert info is not None
    titles = set()
    with open(Path(info.path) / "chunks.jsonl") as src:
        for line in src:
            # A section's own heading (chunks carry the whole title path).
            leaf = json.loads(line)["title"].split(" › ")[-1]
            title = " ".join(_ROLE.sub(r"\1", leaf).replace("---", "-").split())
            if len(title) >= 4:
                titles.add(title)
    queries = [q for t in sorted(titles) for q in ([t] if t.endswith("?") else [f.format(t) for f in _FORMS])]
    random.Random(seed).shuffle(queries)
    return queries


class Ceiling:
    """64 of the load's queries encoded as one batch and searched as one batch, in this process.

    Timed right before and right after ragline's 64-client run (the machine's speed drifts over
    minutes): 8 batches each time; the ceiling is the mean of the two best batches, and beside it
    all 16 together (the loaded runs are sustained rates). Also timed, for reading the gap: the
    same with batches of 32, the size ragline's batches take at 64 clients (two in turn)."""

    def __init__(self, embedder: Any, index: Any, queries: list[str]) -> None:
        self._embedder = embedder
        self._index = index
        self._batch = [escape_query(q) for q in queries[:64]]
        self._best: list[float] = []
        self._took: list[float] = []
        self._half_best: list[float] = []

    def time_batches(self, rounds: int = 8) -> None:
        took = [self._time(self._batch) for _ in range(rounds)]
        self._best.append(min(took))
        self._took += took
        halves = (self._batch[:32], self._batch[32:])
        self._half_best.append(min(self._time(halves[i % 2]) for i in range(rounds)))

    def _time(self, batch: list[str]) -> float:
        started = time.perf_counter()
        self._index.search(self._embedder.encode(batch), 5)
        return time.perf_counter() - started

    def figures(self) -> dict[str, float]:
        return {
            "ceiling_qps": float(np.mean([len(self._batch) / best for best in self._best])),
            "ceiling_sustained_qps": len(self._batch) * len(self._took) / sum(self._took),
            "ceiling_32_qps": float(np.mean([32 / best for best in self._half_best])),
        }


def recall_and_ceiling(
    settings: Settings, labels: list[tuple[str, str, str]], queries: list[str]
) -> tuple[dict[str, float], Ceiling]:
    import faiss
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.embedder import Embedder

    info = indexes.lookup(sync_client(settings.redis), Keys(settings.redis.key_prefix), INDEX)
    assert info is not None
    hnsw = index_store.load(info, ef_search=settings.retrieval.hnsw_ef_search)
    vectors = hnsw.index.reconstruct_n(0, hnsw.index.ntotal)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    ivf = index_store.build_ivfpq(
        vectors,
        index_store.IvfPqParams(
            nlist=settings.retrieval.ivf_nlist,
            pq_m=settings.retrieval.ivf_pq_m,
            refine=settings.retrieval.ivf_refine,
        ),
        nprobe=settings.retrieval.ivf_nprobe,
    )
    embedder = Embedder(settings.retrieval)
    q = embedder.encode([question for question, _, _ in labels])
    relevant = [
        {i for i, c in enumerate(hnsw.chunks) if c.source == src and anchor in c.anchors}
        for _, src, anchor in labels
    ]
    knobs = index_store.SearchKnobs(refine_k_factor=settings.retrieval.ivf_refine_k_factor)
    ivf_loaded = index_store.LoadedIndex(info.model_copy(update={"index_type": "ivfpq"}), ivf, hnsw.chunks)
    out: dict[str, float] = {}
    for name, index in (("flat", flat), ("hnsw", hnsw.index)):
        _, ids = index.search(q, 10)
        out.update(_rank_metrics(name, ids, relevant))
    position = {c.chunk_id: i for i, c in enumerate(hnsw.chunks)}
    ids = np.array([[position[c.chunk_id] for c, _ in row] for row in ivf_loaded.search(q, 10, knobs)])
    out.update(_rank_metrics("ivfpq", ids, relevant))

    return out, Ceiling(embedder, hnsw, queries)


def _rank_metrics(name: str, ids: np.ndarray, relevant: list[set[int]]) -> dict[str, float]:
    hits, rr = 0, 0.0
    for row, rel in zip(ids, relevant, strict=True):
        ranks = [r for r, i in enumerate(row[:10]) if int(i) in rel]
        if ranks:
            hits += 1
            rr += 1 / (ranks[0] + 1)
    return {f"{name}_recall_at_10": hits / len(relevant), f"{name}_mrr_at_10": rr / len(relevant)}


def warm_cache(url: str, queries: list[str]) -> bytes:
    """Ask every warm-set query once, check that each is a cache hit; one hit's body back."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.loadgen import escape_query

    with httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(8) as pool:

        def ask(q: str) -> bool:
            reply = client.post("/v1/query", json={"query": escape_query(q), "mode": "retrieval"})
            reply.raise_for_status()
            return bool(reply.json()["cached"])

        list(pool.map(ask, queries))
        hits = sum(pool.map(ask, queries))
    if hits != len(queries):
        raise RuntimeError(f"warm-up left {len(queries) - hits} of {len(queries)} queries uncached")
    with httpx.Client(base_url=url, timeout=60) as client:
        reply = client.post("/v1/query", json={"query": escape_query(queries[0]), "mode": "retrieval"})
        return reply.content


@dataclass
class Load:
    """wrk runs against one server; in unique (cold) runs no query is sent twice to it."""

    url: str
    queries: list[str]
    unique: bool
    extra: str = ""
    offset: int = 0

    def run(self, connections: int, duration_s: float) -> LoadResult:
        result = run_wrk(
            self.url,
            self.queries,
            connections=connections,
            duration_s=duration_s,
            unique=self.unique,
            extra_json=self.extra,
            offset=self.offset,
        )
        self.offset += result.requests + connections  # the ones in flight at the end were sent too
        return result

    def warm_up(self) -> None:
        """Untimed: the first requests to a fresh process pay for lazy initialisation."""
        self.run(4, 3)


def measure(load: Load, concurrency: tuple[int, ...], *, duration: float) -> list[LoadResult]:
    results = []
    for c in concurrency:
        results.append(load.run(c, duration))
        print(f"  {load.url} c={c}: {results[-1].row()}", flush=True)
    return results


def interleaved(
    loads: dict[str, Load], *, connections: int, duration: float, slices: int = 5
) -> dict[str, LoadResult]:
    """One client against each server in turn, ``slices`` times: a shared machine's speed drifts
    over minutes (the same server's lone P50 moves between runs), so the servers compared share
    each stretch of it. P50 is the median of the slices' P50s, P99 the worst slice's."""
    parts: dict[str, list[LoadResult]] = {name: [] for name in loads}
    for _ in range(slices):
        for name, load in loads.items():
            parts[name].append(load.run(connections, max(1.0, duration / slices)))
    combined = {}
    for name, rows in parts.items():
        combined[name] = _combined(rows, connections)
        print(f"  {name} c={connections} (interleaved): {combined[name].row()}", flush=True)
    return combined


def start_reference(kind: str, settings: Settings) -> Server:
    """One of bench/servers.py's servers."""
    port = free_port()
    print(f"{kind} server", flush=True)
    return _start(
        [[sys.executable, "-m", "bench.servers", kind, "--port", str(port)]],
        settings_env(settings),
        f"http://127.0.0.1:{port}",
        {"query": "warm up"},
    )


def start_ragline(settings: Settings, prefix: str, **update: object) -> Server:
    """An API and a retrieval worker on a fresh port, under ``prefix``."""
    port = free_port()
    env = settings_env(settings.replace(**{"api_port": port, "key_prefix": prefix, **update}))
    return _start(
        [
            [sys.executable, "-m", "ragline", "worker", "retrieval"],
            [sys.executable, "-m", "ragline", "api"],
        ],
        env,
        f"http://127.0.0.1:{port}",
        {"query": "warm up", "mode": "retrieval"},
    )


def mode_throughput(
    settings: Settings, queries: list[str], *, duration: float, rounds: int = 2
) -> dict[str, LoadResult]:
    """Cold retrieval at 64 clients with the worker's default mode against dense-only. The mode
    is the worker's (RAGLINE_RETRIEVAL_MODE), so each has a stack of its own, one up at a time
    (they would share the retrieval queue), in turns, so both see the same stretches of a
    shared machine's drift."""
    parts: dict[str, list[LoadResult]] = {"dense": [], settings.retrieval.retrieval_mode: []}
    offset = 0
    for _ in range(rounds):
        for mode in parts:
            prefix = fresh_prefix(settings)
            try:
                server = start_ragline(settings, prefix, retrieval_mode=mode)
                try:
                    load = Load(
                        server.url, queries, unique=True, extra=', "mode": "retrieval"', offset=offset
                    )
                    load.warm_up()
                    parts[mode].append(load.run(64, duration / rounds))
                    offset = load.offset
                    print(f"  {mode} c=64: {parts[mode][-1].row()}", flush=True)
                finally:
                    server.stop()
            finally:
                forget_prefix(settings, prefix)
    return {mode: _combined(rows, 64) for mode, rows in parts.items()}


def _combined(rows: list[LoadResult], connections: int) -> LoadResult:
    """Slices of one load as one row: their rate over their time, the median P50, the worst P99."""
    requests = sum(r.requests for r in rows)
    return LoadResult(
        connections=connections,
        requests=requests,
        rps=requests / sum(r.requests / r.rps for r in rows if r.rps),
        p50_ms=float(np.median([r.p50_ms for r in rows])),
        p99_ms=max(r.p99_ms for r in rows),
        errors=sum(r.errors for r in rows),
    )


def report_modes(modes: dict[str, LoadResult], default: str) -> dict[str, float]:
    print("\n| retrieval mode (64 clients, cold) | req/s | P50 ms | P99 ms | errors |\n|---|---|---|---|---|")
    for mode, r in modes.items():
        print(f"| {mode} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} |")
    return {f"{default}_over_dense_throughput_64": modes[default].rps / modes["dense"].rps}


def main() -> int:
    interrupt_on_signals()  # SIGTERM (a timeout, say) unwinds like Ctrl-C: the servers are stopped
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--modes-only", action="store_true", help="only the default retrieval mode against dense-only"
    )
    args = parser.parse_args()
    if not args.docs.exists():
        raise SystemExit(f"{args.docs} not found: apt-get install python3.11-doc")

    # Keys and rate limits off: this measures serving, and wrk sends no key.
    settings = Settings().replace(
        home=args.home,
        redis_url=args.redis_url,
        default_index=INDEX,
        torch_threads=2,
        auth_enabled=False,
        rate_limit_enabled=False,
    )
    (args.home / "models").parent.mkdir(parents=True, exist_ok=True)
    ensure_index(settings, args.docs)
    labels = faq_labels(args.docs)
    queries = load_queries(settings)
    print(f"{len(labels)} FAQ labels, {len(queries)} distinct load queries", flush=True)
    if args.modes_only:
        print(f"{settings.retrieval.retrieval_mode} (the default) against dense-only, 64 clients", flush=True)
        ratio = report_modes(
            mode_throughput(settings, queries, duration=args.duration), settings.retrieval.retrieval_mode
        )
        print(json.dumps({k: round(v, 3) for k, v in ratio.items()}))
        return 0

    print("recall@10 and MRR@10 on the FAQ labels", flush=True)
    quality, ceiling = recall_and_ceiling(settings, labels, queries)
    print("  ", quality, flush=True)

    results: dict[str, list[LoadResult]] = {}
    retrieval_only = ', "mode": "retrieval"'

    naive_server = start_reference("naive", settings)
    print("ragline (API + retrieval worker)", flush=True)
    # Its own key prefix: the result and embedding caches start empty (cold), whatever earlier runs left.
    prefix = fresh_prefix(settings)
    try:
        ragline = start_ragline(settings, prefix)
    except BaseException:
        naive_server.stop()
        raise
    try:
        naive = Load(naive_server.url, queries, unique=True)
        cold = Load(ragline.url, queries, unique=True, extra=retrieval_only)
        naive.warm_up()
        cold.warm_up()
        # Both are up (the idle one takes no measurable CPU): the lone runs take turns.
        lone = interleaved({"naive": naive, "ragline_cold": cold}, connections=1, duration=args.duration)
        loaded = CONCURRENCY[1:]
        results["naive"] = [lone["naive"], *measure(naive, loaded, duration=args.duration)]
        naive_server.stop()
        results["ragline_cold"] = [lone["ragline_cold"], *measure(cold, loaded[:-1], duration=args.duration)]
        print("ceiling, then ragline at 64 clients, then the ceiling again", flush=True)
        ceiling.time_batches()
        results["ragline_cold"] += measure(cold, loaded[-1:], duration=args.duration)
        ceiling.time_batches()
        quality.update(ceiling.figures())
        print("  ", ceiling.figures(), flush=True)
        warm_set = queries[:200]
        hit = warm_cache(ragline.url, warm_set)
        # The floor returns a body as large as a real cached answer (top_k sources with their text).
        import redis

        redis.Redis.from_url(args.redis_url).set("ragline-bench:floor", hit)
        warm = Load(ragline.url, warm_set, unique=False, extra=retrieval_only)
        results["ragline_warm"] = measure(warm, CONCURRENCY, duration=args.duration)
    finally:
        naive_server.stop()
        ragline.stop()
        forget_prefix(settings, prefix)

    floor_server = start_reference("floor", settings)
    try:
        floor = Load(floor_server.url, ["x"], unique=False)
        floor.warm_up()
        results["floor"] = measure(floor, CONCURRENCY, duration=args.duration)
    finally:
        floor_server.stop()

    print("the default retrieval mode against dense-only, 64 clients", flush=True)
    modes = mode_throughput(settings, queries, duration=args.duration)
    return report(results, quality, args.out, modes, settings.retrieval.retrieval_mode)


def report(
    results: dict[str, list[LoadResult]],
    quality: dict[str, float],
    out: Path,
    modes: dict[str, LoadResult],
    default_mode: str,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    print("\n| server | clients | req/s | P50 ms | P99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        for r in rows:
            print(
                f"| {name} | {r.connections} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} |"
            )
    print(f"| ceiling (64-query batch, in process; best batch) | - | {quality['ceiling_qps']:.0f} | | | |")
    print(f"| ceiling, all 16 batches together | - | {quality['ceiling_sustained_qps']:.0f} | | | |")
    print(f"| ceiling with 32-query batches (best batch) | - | {quality['ceiling_32_qps']:.0f} | | | |")
    print("\n| index | recall@10 | MRR@10 |\n|---|---|---|")
    for name in ("flat", "hnsw", "ivfpq"):
        print(f"| {name} | {quality[f'{name}_recall_at_10']:.3f} | {quality[f'{name}_mrr_at_10']:.3f} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax50, ax99) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in results.items():
        xs = [r.connections for r in rows]
        ax50.plot(xs, [r.p50_ms for r in rows], marker="o", label=name)
        ax99.plot(xs, [r.p99_ms for r in rows], marker="o", label=name)
    for ax, title in ((ax50, "P50"), (ax99, "P99")):
        ax.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="latency (ms)", title=title)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.legend()
    fig.tight_layout()
    plot = out / "retrieval_latency.png"
    fig.savefig(plot, dpi=100)
    print(f"\nplot: {plot}")

    by = {name: {r.connections: r for r in rows} for name, rows in results.items()}
    headline = {
        "cold_throughput_ratio_64": by["ragline_cold"][64].rps / by["naive"][64].rps,
        "cold_over_ceiling_64": by["ragline_cold"][64].rps / quality["ceiling_qps"],
        "cold_over_sustained_ceiling_64": by["ragline_cold"][64].rps / quality["ceiling_sustained_qps"],
        "cold_p99_over_naive_64": by["ragline_cold"][64].p99_ms / by["naive"][64].p99_ms,
        "p50_over_naive_1": by["ragline_cold"][1].p50_ms / by["naive"][1].p50_ms,
        "warm_p50_over_floor": by["ragline_warm"][64].p50_ms / by["floor"][64].p50_ms,
        "hnsw_recall_ratio": quality["hnsw_recall_at_10"] / quality["flat_recall_at_10"],
        "hnsw_recall_at_10": quality["hnsw_recall_at_10"],
        **report_modes(modes, default_mode),
    }
    print(json.dumps({k: round(v, 3) for k, v in headline.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
