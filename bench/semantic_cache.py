"""The semantic cache's threshold, measured: hit rate, false-hit rate and the lookup's added latency.

    .venv/bin/python -m bench.semantic_cache [--pairs bench/data/pydocs_semantic_pairs.tsv]

The set: questions about the Python docs in labelled pairs (bench/data/pydocs_semantic_pairs.tsv,
written by hand), an earlier question and a later one, ``hit`` when the earlier one's answer
answers the later one (a paraphrase) and ``miss`` when it does not (a near-miss: ``list.sort`` and
``sorted``, ``copy`` and ``deepcopy``, one direction and the other, a negation). Paraphrase
labels join questions into classes (a later question may paraphrase several earlier ones).

Embedded with the retrieval worker's own encoder (MiniLM unless RAGLINE_EMBEDDING_MODEL says
otherwise), and judged as the worker judges: every earlier question is put in one scope's index
(the worker's HNSW), every later question looks up its nearest one there (one it shares its
normalised text with does not count: the result cache would have answered it), and at a
threshold a lookup is served when its nearest question is at least that similar:

- hit rate: later questions with a paraphrase among the earlier ones that were served an answer
  of their class, out of all of them;
- false-hit rate: answers served from another class (a wrong answer), out of all answers served;
- near-misses served: later questions with no paraphrase among the earlier ones that were
  served anything, out of all of them; and, pair by pair, the share of ``miss`` pairs at or
  above the threshold.

The default threshold is the lowest one of the sweep at and above which every threshold's
false-hit rate is at most ``--max-false`` (1%), and at most that share of ``miss`` pairs clears
it: a threshold that is safe only between two unsafe ones is not chosen.

The added latency: the worker's whole lookup (bringing the scope up to date from Redis, the
HNSW search, fetching the answer, proposing the misses) through a real Redis at
RAGLINE_REDIS_URL, under a key prefix of its own that is removed afterwards, for one query
and for a batch of 32; beside it, the encode of one query, which the lookup follows.

The last line printed is one JSON object with the chosen threshold and its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import CachedAnswer
from ragline.broker.redis.keys import Keys
from ragline.broker.state.normalize import normalize_query

DEFAULT_PAIRS = Path(__file__).parent / "data" / "pydocs_semantic_pairs.tsv"
# Finer at the top, where the near-misses that differ in word order only still clear it.
SWEEP = [round(0.70 + 0.01 * i, 2) for i in range(29)] + [round(0.99 + 0.001 * i, 3) for i in range(10)]


@dataclass(frozen=True, slots=True)
class Pair:
    earlier: str
    later: str
    same: bool  # "hit": the earlier answer answers the later question
    light: bool = False  # a light rephrasing of the earlier question (its framing, an abbreviation)


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        earlier, later, label, *rest = line.split("\t")
        if label not in ("hit", "miss"):
            raise ValueError(f"{path}: label {label!r} is neither hit nor miss: {line!r}")
        pairs.append(Pair(earlier, later, label == "hit", light=bool(rest) and rest[0] == "light"))
    return pairs


class Classes:
    """Questions joined by paraphrase labels (union-find over their texts)."""

    def __init__(self, pairs: list[Pair]) -> None:
        self._parent: dict[str, str] = {}
        for p in pairs:
            if p.same:
                self._parent[self.find(p.earlier)] = self.find(p.later)

    def find(self, text: str) -> str:
        root = text
        while self._parent.get(root, root) != root:
            root = self._parent[root]
        return root

    def same(self, a: str, b: str) -> bool:
        return self.find(a) == self.find(b)


@dataclass(frozen=True, slots=True)
class Lookup:
    later: str
    should_hit: bool  # it has a paraphrase among the earlier questions
    light: bool  # ... and it is a light rephrasing of one
    similarity: float  # of its nearest earlier question (-inf: none)
    right: bool  # that question's answer answers it


def deployed_lookups(pairs: list[Pair], vectors: dict[str, np.ndarray], settings: Settings) -> list[Lookup]:
    """Each later question's nearest earlier one, in one scope's HNSW as the worker holds it."""
    from ragline.broker.state.semantic_cache import Entry
    from ragline.workers.retrieval.index_builders import HnswParams
    from ragline.workers.retrieval.semantic_cache import ScopeIndex

    classes = Classes(pairs)
    earlier = sorted({p.earlier for p in pairs})
    r = settings.retrieval
    index = ScopeIndex(
        len(next(iter(vectors.values()))), HnswParams(r.hnsw_m, r.hnsw_ef_construction, r.hnsw_ef_search)
    )
    index.add([Entry(f"{i + 1}-0", q, vectors[q].tobytes(), q) for i, q in enumerate(earlier)])
    should_hit = {p.later for p in pairs if p.same}
    light = {p.later for p in pairs if p.same and p.light}
    lookups = []
    for later in sorted({p.later for p in pairs}):
        similarity, match = float("-inf"), ""
        for row, score in index.search(vectors[later][None, :], 2)[0]:
            candidate = index.questions[row] if row >= 0 else ""
            if row >= 0 and normalize_query(candidate) != normalize_query(later):
                similarity, match = score, candidate
                break
        right = bool(match) and classes.same(match, later)
        lookups.append(Lookup(later, later in should_hit, later in light, similarity, right))
    return lookups


@dataclass(frozen=True, slots=True)
class Row:
    threshold: float
    hit_rate: float
    light_hit_rate: float  # of the light rephrasings alone
    false_hit_rate: float
    near_misses_served: float
    miss_pairs_above: float
    paraphrase_pairs_above: float
    served: int


def sweep(lookups: list[Lookup], pairs: list[Pair], vectors: dict[str, np.ndarray]) -> list[Row]:
    similarity = {(p.earlier, p.later): float(vectors[p.earlier] @ vectors[p.later]) for p in pairs}
    hits = [p for p in pairs if p.same]
    misses = [p for p in pairs if not p.same]
    paraphrased = [lk for lk in lookups if lk.should_hit]
    light = [lk for lk in paraphrased if lk.light]
    unparaphrased = [lk for lk in lookups if not lk.should_hit]
    rows = []
    for t in SWEEP:
        served = [lk for lk in lookups if lk.similarity >= t]
        wrong = sum(not lk.right for lk in served)
        rows.append(
            Row(
                threshold=t,
                hit_rate=sum(lk.right for lk in paraphrased if lk.similarity >= t) / len(paraphrased),
                light_hit_rate=sum(lk.right for lk in light if lk.similarity >= t) / max(1, len(light)),
                false_hit_rate=wrong / len(served) if served else 0.0,
                near_misses_served=sum(lk.similarity >= t for lk in unparaphrased)
                / max(1, len(unparaphrased)),
                miss_pairs_above=sum(similarity[(p.earlier, p.later)] >= t for p in misses) / len(misses),
                paraphrase_pairs_above=sum(similarity[(p.earlier, p.later)] >= t for p in hits) / len(hits),
                served=len(served),
            )
        )
    return rows


def choose(rows: list[Row], max_false: float) -> Row | None:
    """The lowest threshold at and above which every row is within ``max_false``."""
    chosen = None
    for row in reversed(rows):  # highest first
        if row.false_hit_rate > max_false or row.miss_pairs_above > max_false:
            break
        chosen = row
    return chosen


def lookup_latency(
    settings: Settings, pairs: list[Pair], vectors: dict[str, np.ndarray], threshold: float
) -> dict[str, float] | None:
    """Milliseconds of the worker's lookup through Redis (P50 and P99, for one query and for a
    batch of 32), with every earlier question in the scope; None when no Redis answers."""
    import redis
    import redis.asyncio as aioredis
    from ragline.broker.state.semantic_cache import Pending, SemanticCommits, SemanticStore
    from ragline.workers.retrieval.index_builders import HnswParams
    from ragline.workers.retrieval.semantic_cache import Probe, SemanticCache

    url = settings.redis.redis_url
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError:
        return None
    keys = Keys(f"bench-semantic-{uuid.uuid4().hex[:8]}")
    scope = "bench"
    earlier = sorted({p.earlier for p in pairs})
    answer = CachedAnswer(answer="an answer of about this size " * 20, cached=True, sources=[]).encode()
    store = SemanticStore(client, keys, pending_ttl_s=600)
    r = settings.retrieval

    async def fill() -> None:
        aclient = aioredis.Redis.from_url(url)
        commits = SemanticCommits(
            aclient, keys, ttl_s=600, scope_max_entries=len(earlier) + 1, max_entries=len(earlier) + 1
        )
        for i, q in enumerate(earlier):
            client.set(f"{keys.prefix}:qc:{i}", answer, ex=600)
            store.propose([Pending(f"fill-{i}", scope, q, vectors[q].tobytes())])
            await commits.commit(f"fill-{i}", scope, f"{keys.prefix}:qc:{i}")
        await aclient.aclose()

    try:
        asyncio.run(fill())
        cache = SemanticCache(
            store,
            dim=len(vectors[earlier[0]]),
            threshold=threshold,
            hnsw=HnswParams(r.hnsw_m, r.hnsw_ef_construction, r.hnsw_ef_search),
            scope_max_entries=len(earlier) + 1,
            loaded_scopes=4,
        )
        later = sorted({p.later for p in pairs})
        cache.lookup([Probe("warm", scope, later[0], vectors[later[0]])])  # reads the scope once
        one = []
        for i, q in enumerate(later):
            started = time.perf_counter()
            cache.lookup([Probe(f"one-{i}", scope, q, vectors[q])])
            one.append((time.perf_counter() - started) * 1000)
        batches = []
        for start in range(0, len(later) - 31, 32):
            batch = [
                Probe(f"b-{start}-{j}", scope, q, vectors[q]) for j, q in enumerate(later[start : start + 32])
            ]
            started = time.perf_counter()
            cache.lookup(batch)
            batches.append((time.perf_counter() - started) * 1000)
    finally:
        for key in client.scan_iter(f"{keys.prefix}:*"):
            client.delete(key)
    return {
        "one_p50_ms": statistics.median(one),
        "one_p99_ms": float(np.percentile(one, 99)),
        "batch32_p50_ms": statistics.median(batches),
        "batch32_p99_ms": float(np.percentile(batches, 99)),
    }


def encode_ms(embedder: object, texts: list[str]) -> float:
    """P50 milliseconds of encoding one query (what a lone lookup follows)."""
    times = []
    for text in texts:
        started = time.perf_counter()
        embedder.encode([text])  # type: ignore[attr-defined]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument(
        "--max-false", type=float, default=0.01, help="the false-hit rate the default may have"
    )
    args = parser.parse_args()

    from ragline.workers.retrieval.embedder import Embedder

    settings = Settings()
    pairs = read_pairs(args.pairs)
    texts = sorted({p.earlier for p in pairs} | {p.later for p in pairs})
    embedder = Embedder(settings.retrieval)
    embedder.encode(["warm up"])
    vectors = dict(zip(texts, embedder.encode(texts), strict=True))
    lookups = deployed_lookups(pairs, vectors, settings)
    rows = sweep(lookups, pairs, vectors)

    should = sum(lk.should_hit for lk in lookups)
    light = sum(lk.light for lk in lookups)
    print(
        f"{len(pairs)} pairs ({sum(p.same for p in pairs)} paraphrase, "
        f"{sum(not p.same for p in pairs)} near-miss); "
        f"{len({p.earlier for p in pairs})} earlier questions cached, {len(lookups)} later ones looked up "
        f"({should} with a paraphrase among them, {light} of those a light one); encoder {embedder.model_id}"
    )
    print(
        f"{'threshold':>9} {'hit rate':>8} {'(light)':>8} {'false-hit':>9} {'served':>6} {'near-miss':>9} "
        f"{'miss pairs':>10} {'para pairs':>10}"
    )
    for row in rows:
        print(
            f"{row.threshold:>9.3f} {row.hit_rate:>8.1%} {row.light_hit_rate:>8.1%} "
            f"{row.false_hit_rate:>9.1%} {row.served:>6} {row.near_misses_served:>9.1%} "
            f"{row.miss_pairs_above:>10.1%} {row.paraphrase_pairs_above:>10.1%}"
        )
    chosen = choose(rows, args.max_false)
    if chosen is None:
        print(f"no threshold of the sweep keeps the false-hit rate at or under {args.max_false:.1%}")
        return 1
    print(
        f"default threshold: {chosen.threshold} (the lowest with a false-hit rate <= {args.max_false:.0%} "
        f"at and above it): hit rate {chosen.hit_rate:.1%} (light rephrasings {chosen.light_hit_rate:.1%}), "
        f"false-hit rate {chosen.false_hit_rate:.1%}, "
        f"near-misses served {chosen.near_misses_served:.1%}, "
        f"near-miss pairs above it {chosen.miss_pairs_above:.1%}"
    )
    wrong = [lk for lk in lookups if lk.similarity >= chosen.threshold and not lk.right]
    for lk in wrong:
        print(f"  served wrongly at {lk.similarity:.3f}: {lk.later!r}")

    latency = lookup_latency(settings, pairs, vectors, chosen.threshold)
    one_encode = encode_ms(embedder, texts[:100])
    if latency is None:
        print(f"no Redis at {settings.redis.redis_url}: the lookup's latency was not measured")
    else:
        print(
            f"lookup through Redis, {len({p.earlier for p in pairs})} questions in the scope: one query "
            f"P50 {latency['one_p50_ms']:.2f} ms, P99 {latency['one_p99_ms']:.2f} ms; a batch of 32 "
            f"P50 {latency['batch32_p50_ms']:.2f} ms, P99 {latency['batch32_p99_ms']:.2f} ms "
            f"(encoding one query: P50 {one_encode:.2f} ms)"
        )
    result: dict[str, float | None] = {
        "threshold": chosen.threshold,
        "hit_rate": round(chosen.hit_rate, 4),
        "light_hit_rate": round(chosen.light_hit_rate, 4),
        "false_hit_rate": round(chosen.false_hit_rate, 4),
        "near_misses_served": round(chosen.near_misses_served, 4),
        "miss_pairs_above": round(chosen.miss_pairs_above, 4),
        "encode_one_p50_ms": round(one_encode, 3),
    }
    if latency is not None:
        result.update({k: round(v, 3) for k, v in latency.items()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
