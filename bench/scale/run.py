"""Retrieval at scale: HNSW, IVF-PQ with refine in memory, and IVF-PQ on disk, at 1M and 10M
vectors, in one run (issue 21, item 4).

    .venv/bin/python -m bench.scale [--sizes 1m,10m] [--types hnsw,ivfpq,ivfpq-disk] [--quick]

Corpus: synthetic clustered 384-d unit vectors (bench/scale/data.py), made block by block from a
seed, with held-out queries and their exact top-10 by brute force over the whole corpus. Indexes:
ragline's own builders and a worker's default search knobs (RAGLINE_HNSW_EF_SEARCH,
RAGLINE_IVF_NPROBE, ... apply), cached under ``<home>/bench-scale/`` (bench/scale/index.py); a
type whose index would not fit in ``--max-index-gb`` is skipped. Each index is measured in a
fresh process (bench/scale/probe.py): the resident memory loading and searching it adds,
recall@10, P50/P99 of single queries and of 32-query batches. Printed: a table, the targets,
the plot ``scale_latency.png`` (latency against corpus size per index type), and last one JSON
line. ``--quick`` is one 100k corpus and fewer queries. ``--shards`` adds the scatter-gather
through the API over 1, 2 and 4 shards of the 1M corpus against one unsharded worker, on real
processes (bench/scale/shards.py; ``--quick``: a 10k corpus and a few rounds): a table of its
own, and ``shards4_over_1_p99`` in the JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ragline.broker.config.settings import RetrievalSettings, Settings

from bench.scale import shards as scale_shards
from bench.scale.data import Corpus
from bench.scale.index import TYPES, Built, build_command, cached, ensure_truth, estimated_bytes
from bench.scale.probe import Probe
from ragline.processes import interrupt_on_signals

_PROBE_TIMEOUT_S = 3600  # a 10M on-disk index searched cold, on a slow disk, with room to spare
_BUILD_TIMEOUT_S = 12 * 3600  # 10M IVF-PQ on 2 cores: k-means over ~12k lists, then 10M adds


@dataclass(frozen=True)
class Row:
    n: int
    index_type: str
    built: Built | None  # None: skipped
    probe: Probe | None
    note: str = ""


def parse_size(text: str) -> int:
    """``20k``, ``1m``, ``10M`` or a plain count."""
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    size = int(float(number) * scale)
    if size < 1000:
        raise ValueError(f"corpus size {text!r}: at least 1k vectors")
    return size


def _label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k"


def run_probe(built: Built, truth_queries: Path, truth_top: Path, warm_up: int) -> Probe:
    cmd = [sys.executable, "-m", "bench.scale.probe", str(built.folder), built.index_type]
    cmd += [str(truth_queries), str(truth_top), "--warm-up", str(warm_up)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return Probe(**json.loads(done.stdout.strip().splitlines()[-1]))


def build(root: Path, index_type: str, corpus: Corpus, settings: RetrievalSettings) -> Built:
    """From the cache, or built in a process of its own (bench/scale/index.py)."""
    if (found := cached(root, index_type, corpus, settings)) is not None:
        return found
    subprocess.run(build_command(root, index_type, corpus), timeout=_BUILD_TIMEOUT_S, check=True)
    built = cached(root, index_type, corpus, settings)
    if built is None:
        raise RuntimeError(f"building {index_type} for {corpus.key} left nothing in {root}")
    return replace(built, cached=False)


def measure_size(
    root: Path, n: int, types: list[str], settings: RetrievalSettings, args: argparse.Namespace
) -> list[Row]:
    corpus = Corpus(n=n, clusters=args.clusters, seed=args.seed)
    truth = ensure_truth(root, corpus, args.queries)
    print(
        f"{_label(n)}: exact top-10 of {args.queries} queries, {truth.seconds:.0f} s"
        f"{' (cached)' if truth.cached else ''}",
        flush=True,
    )
    rows = []
    for index_type in types:
        needs_gb = estimated_bytes(index_type, corpus, settings) / 1e9
        if needs_gb > args.max_index_gb:
            note = f"does not fit: ~{needs_gb:.1f} GB > --max-index-gb {args.max_index_gb:g}"
            print(f"{_label(n)} {index_type}: {note}", flush=True)
            rows.append(Row(n, index_type, None, None, note))
            continue
        print(f"{_label(n)} {index_type}: building (or from the cache)", flush=True)
        built = build(root, index_type, corpus, settings)
        print(
            f"{_label(n)} {index_type}: built in {built.build_s:.0f} s"
            f"{' (cached)' if built.cached else ''}; measuring",
            flush=True,
        )
        rows.append(Row(n, index_type, built, run_probe(built, truth.queries, truth.top_k, args.warm_up)))
    return rows


def measure_shards(root: Path, settings: Settings, args: argparse.Namespace) -> scale_shards.ShardRun:
    """The scatter-gather over 1, 2 and 4 shards through the API, against one unsharded worker."""
    corpus = Corpus(n=args.shard_size, clusters=args.clusters, seed=args.seed)
    return scale_shards.measure(
        root,
        corpus,
        settings,
        rounds=args.shard_rounds,
        warm_up=args.shard_warm_up,
        redis_url=args.shard_redis_url,
        seed=args.seed,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| vectors | index | build s (peak RSS GB) | RSS GB (file-backed) | B/vector RSS | B/vector disk "
        "| recall@10 | single P50 / P99 ms | 32-batch P50 / P99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.built is None or r.probe is None:
            lines.append(f"| {_label(r.n)} | {r.index_type} | {r.note} | | | | | | |")
            continue
        p, b = r.probe, r.built
        lines.append(
            f"| {_label(r.n)} | {r.index_type} | {b.build_s:.0f} ({b.build_peak_rss_gb:.1f})"
            f"{' (cached)' if b.cached else ''} "
            f"| {p.rss_gb:.2f} ({p.rss_file_gb:.2f}) | {p.rss_gb * 1e9 / r.n:.0f} "
            f"| {b.disk_bytes() / r.n:.0f} | {p.recall_at_10:.3f} "
            f"| {p.single_p50_ms:.2f} / {p.single_p99_ms:.2f} | {p.batch_p50_ms:.1f} / {p.batch_p99_ms:.1f} |"
        )
    return "\n".join(lines)


def _find(rows: list[Row], n: int, index_type: str) -> Probe | None:
    return next((r.probe for r in rows if r.n == n and r.index_type == index_type), None)


def headline(rows: list[Row], shards4_over_1_p99: float | None) -> dict[str, float | None]:
    hnsw, disk = _find(rows, 1_000_000, "hnsw"), _find(rows, 10_000_000, "ivfpq-disk")
    return {
        "hnsw_1m_p99_ms": hnsw.single_p99_ms if hnsw else None,
        "hnsw_1m_recall": hnsw.recall_at_10 if hnsw else None,
        "disk_10m_rss_gb": disk.rss_gb if disk else None,
        "disk_10m_recall": disk.recall_at_10 if disk else None,
        "disk_10m_p99_ms": disk.single_p99_ms if disk else None,
        "shards4_over_1_p99": shards4_over_1_p99,
    }


def targets(rows: list[Row], shards4_over_1_p99: float | None) -> str:
    """The issue's targets on this box: met, missed, or not measured in this run."""
    hnsw = _find(rows, 1_000_000, "hnsw")
    fits = [(t, p) for t in TYPES if (p := _find(rows, 10_000_000, t)) is not None]
    checks = [
        (
            "1M HNSW: P99 <= 10 ms at recall@10 >= 0.95",
            None if hnsw is None else hnsw.single_p99_ms <= 10 and hnsw.recall_at_10 >= 0.95,
        ),
        (
            "10M: an index in <= 8 GB RSS, recall@10 >= 0.90, P99 <= 100 ms"
            + (f" ({', '.join(t for t, _ in fits)})" if fits else ""),
            None
            if not fits
            else any(p.rss_gb <= 8 and p.recall_at_10 >= 0.90 and p.single_p99_ms <= 100 for _, p in fits),
        ),
        (
            "4 shards: P99 <= 1.5x unsharded",
            None if shards4_over_1_p99 is None else shards4_over_1_p99 <= 1.5,
        ),
    ]
    verdict = {True: "met", False: "**missed**", None: "not measured"}
    return "\n".join(["| target | result |", "|---|---|", *(f"| {t} | {verdict[v]} |" for t, v in checks)])


def plot(rows: list[Row], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax50, ax99) = plt.subplots(1, 2, figsize=(11, 4))
    for index_type in TYPES:
        measured = sorted((r.n, r.probe) for r in rows if r.index_type == index_type and r.probe)
        if not measured:
            continue
        xs = [n for n, _ in measured]
        ax50.plot(xs, [p.single_p50_ms for _, p in measured], marker="o", label=index_type)
        ax99.plot(xs, [p.single_p99_ms for _, p in measured], marker="o", label=index_type)
    for ax, title in ((ax50, "P50, single queries"), (ax99, "P99, single queries")):
        ax.set(xscale="log", yscale="log", xlabel="vectors", ylabel="latency (ms)", title=title)
        ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scale_latency.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _physical_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=None, help="corpus sizes, e.g. 100k,1m,10m (default 1m,10m)")
    parser.add_argument("--types", default=",".join(TYPES), help="index types: " + ", ".join(TYPES))
    parser.add_argument("--quick", action="store_true", help="a 100k corpus (unless --sizes) and 500 queries")
    parser.add_argument("--queries", type=int, default=None, help="held-out queries (default 2000)")
    parser.add_argument("--warm-up", type=int, default=None, help="of those, untimed first (default 100)")
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--home", type=Path, default=None, help="default: RAGLINE_HOME")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--max-index-gb",
        type=float,
        default=round(_physical_gb() / 2, 1),
        help="skip an index type whose build needs more (default: half this machine's RAM)",
    )
    parser.add_argument("--shards", action="store_true", help="1, 2 and 4 shards through the API")
    parser.add_argument("--shard-size", default=None, help="the sharded corpus (default 1m; --quick 10k)")
    parser.add_argument("--shard-rounds", type=int, default=None, help="timed queries per configuration")
    parser.add_argument("--shard-warm-up", type=int, default=None, help="untimed rounds first")
    parser.add_argument(
        "--shard-redis-url",
        default="redis://127.0.0.1:6379/13",
        help="a Redis database of its own for the served stack: flushed at the start and the end",
    )
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ("100k" if args.quick else "1m,10m")
    args.queries = args.queries or (500 if args.quick else 2000)
    args.warm_up = args.warm_up if args.warm_up is not None else min(100, args.queries // 5)
    args.shard_rounds = args.shard_rounds or (30 if args.quick else 1000)
    args.shard_warm_up = args.shard_warm_up if args.shard_warm_up is not None else (3 if args.quick else 20)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        args.shard_size = parse_size(args.shard_size or ("10k" if args.quick else "1m"))
    except ValueError as e:
        parser.error(f"--sizes {args.sizes} / --shard-size {args.shard_size}: {e}")
    types = [t.strip() for t in args.types.split(",")]
    if unknown := set(types) - set(TYPES):
        parser.error(f"unknown index types {sorted(unknown)}: choose from {', '.join(TYPES)}")

    settings = Settings()
    root = (args.home or settings.home) / "bench-scale"
    rows = [row for n in sizes for row in measure_size(root, n, types, settings.retrieval, args)]
    if args.shards:
        interrupt_on_signals()  # SIGTERM unwinds like Ctrl-C: the served processes are stopped
    shard_run = measure_shards(root, settings, args) if args.shards else None
    shards = shard_run.shards4_over_1_p99 if shard_run else None
    print()
    print(table(rows))
    print(
        "\nBuild: IVF-PQ's training counted in both IVF types (done once for both). RSS: what loading"
        " and searching an index added to a fresh process; file-backed pages are memory-mapped files."
    )
    print()
    if shard_run is not None:
        print(scale_shards.table(shard_run))
        print(
            "\nOne client, one query at a time, the configurations in turns; P50/P99 of whole answers"
            " through the API (embedding included). 1 shard: the same index as the unsharded one,"
            " searched by a shard worker over its queue."
        )
        print()
    print(targets(rows, shards))
    print(f"\nplot: {plot(rows, args.out)}")
    print(
        json.dumps(
            {
                k: None if v is None or math.isnan(v) else round(v, 3)
                for k, v in headline(rows, shards).items()
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
