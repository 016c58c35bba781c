"""``ragline eval``: retrieval quality on labelled questions, configurations side by side.

A labelled set is a TSV file: ``question<TAB>expected<TAB>hint``, ``#`` lines and blank lines
skipped. ``expected`` is the file that answers the question, as its path under what was ingested
(``library/shutil.rst.txt``), optionally with the answer section's anchor
(``faq/programming.rst.txt#faq-unboundlocalerror``); a source matches when its file (and then
its anchor) is that. ``hint`` is a word the answer should contain (``--rag``), or empty.

A configuration is a retrieval mode (``dense``, ``lexical``, ``hybrid``) or ``default`` (the
server's), ``-nodiv`` for diversity off, and, in process only, settings after ``@``:
``hybrid@rrf_k=20;max_chunks_per_file=2``. Every question is asked alone, so P50 is a lone
query's latency: in process a retrieval batch of one (embed, search, fuse, rank; the embedding
cache is bypassed), over HTTP the whole request.
"""

from __future__ import annotations

import json
import re
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import RETRIEVAL_MODES, RetrieveRequest, Source, Sources

CUTOFFS = (1, 5, 10)
_CITATION = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True, slots=True)
class Label:
    question: str
    path: str
    anchor: str
    hint: str


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    mode: str | None  # None: the server's default
    diversity: bool
    overrides: dict[str, str]


@dataclass(frozen=True, slots=True)
class Answer:
    sources: list[Source]
    seconds: float
    text: str | None = None
    cited: int = 0


def read_labels(path: Path) -> list[Label]:
    labels = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{path}:{number}: expected 'question<TAB>file[#anchor][<TAB>hint]'")
        file, _, anchor = fields[1].strip().partition("#")
        hint = fields[2].strip() if len(fields) > 2 else ""
        labels.append(Label(fields[0].strip(), file, anchor, hint))
    if not labels:
        raise ValueError(f"{path}: no labelled questions")
    return labels


def parse_config(spec: str) -> Config:
    name = spec.strip()
    head, _, settings = name.partition("@")
    mode, diversity = head, True
    if mode.endswith("-nodiv"):
        mode, diversity = mode.removesuffix("-nodiv"), False
    if mode != "default" and mode not in RETRIEVAL_MODES:
        raise ValueError(f"unknown configuration {spec!r}: a mode is default, {', '.join(RETRIEVAL_MODES)}")
    overrides = {}
    for item in filter(None, settings.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"configuration {spec!r}: settings are key=value, separated by ';'")
        overrides[key.strip()] = value.strip()
    return Config(name, None if mode == "default" else mode, diversity, overrides)


def matches(source: Source, label: Label) -> bool:
    path = source.source.replace("\\", "/")
    if not (path == label.path or path.endswith("/" + label.path)):
        return False
    if not label.anchor:
        return True
    if source.anchor:
        return source.anchor == label.anchor
    # An index ingested before sources had anchors: its titles were the section's own heading,
    # which a section label names by its slug, or is the question itself (the FAQ set's).
    from ragline.workers.retrieval.readers import slug

    return source.title == label.question or slug(source.title) == label.anchor


def score(labels: Sequence[Label], answers: Sequence[Answer]) -> dict[str, float]:
    """recall@1/5/10, MRR@10, P50 ms; with answers, how often they hold the hint and cite nothing."""
    ranks = []
    for label, answer in zip(labels, answers, strict=True):
        rank = next((i for i, s in enumerate(answer.sources[:10], start=1) if matches(s, label)), None)
        ranks.append(rank)
    n = len(labels)
    out = {f"recall@{k}": sum(1 for r in ranks if r is not None and r <= k) / n for k in CUTOFFS}
    out["mrr@10"] = sum(1 / r for r in ranks if r is not None) / n
    out["p50_ms"] = statistics.median(a.seconds for a in answers) * 1000
    texts = [(label, a) for label, a in zip(labels, answers, strict=True) if a.text is not None]
    if texts:
        hinted = [(label, a) for label, a in texts if label.hint]
        if hinted:
            out["hint_rate"] = sum(label.hint.lower() in (a.text or "").lower() for label, a in hinted) / len(
                hinted
            )
        out["uncited_rate"] = sum(a.cited == 0 for _, a in texts) / len(texts)
    return out


# -- asking --------------------------------------------------------------------------------------

Ask = Callable[[str], Answer]


class InProcess:
    """The index loaded as the retrieval worker loads it; each configuration its own retriever."""

    def __init__(self, settings: Settings, index: str, *, top_k: int) -> None:
        import redis

        from ragline.broker.redis.keys import Keys
        from ragline.broker.redis.pool import sync_client
        from ragline.broker.state import indexes
        from ragline.workers.retrieval import index_store
        from ragline.workers.retrieval.embedder import Embedder
        from ragline.workers.retrieval.index_store import IndexCache

        self._settings = settings
        self._index = index
        self._top_k = top_k
        self._client: redis.Redis = sync_client(settings.redis)
        self._keys = Keys(settings.redis.key_prefix)
        if indexes.lookup(self._client, self._keys, index) is None:
            # Redis may have lost the registry: what is on disk is what a worker would serve.
            for info in index_store.current_on_disk(settings.indexes_dir):
                indexes.register(self._client, self._keys, info)
        self._embedder = Embedder(settings.retrieval)
        self._indexes = IndexCache(self._client, self._keys, ef_search=settings.retrieval.hnsw_ef_search)
        self._indexes.get(index)  # unknown index: fail before asking anything

    def asker(self, config: Config) -> Ask:
        from ragline.workers.retrieval.batch import BatchRetriever
        from ragline.workers.retrieval.embedding_cache import EmbeddingCache
        from ragline.workers.retrieval.rerank import reranker

        retrieval = self._settings.retrieval
        if config.overrides:
            retrieval = self._settings.replace(**config.overrides).retrieval
        # A model id of its own: no query of this run is an embedding-cache hit, and none is
        # written (the batch's cache write is never called), so every configuration encodes.
        cache = EmbeddingCache(
            self._client,
            self._keys,
            model_id=f"{self._embedder.model_id}#eval-{uuid.uuid4().hex}",
            dim=self._embedder.dim,
            ttl_s=1,
        )
        retriever = BatchRetriever(
            retrieval, self._embedder, cache, self._indexes, reranker=reranker(retrieval)
        )
        retriever.embed_warm_up()

        def ask(question: str) -> Answer:
            request = RetrieveRequest(
                request_id=f"eval-{uuid.uuid4().hex}",
                query=question,
                top_k=self._top_k,
                mode="retrieval",
                index=self._index,
                retrieval=config.mode,  # type: ignore[arg-type]  # a RetrievalMode: the configs' own names
                diversity=config.diversity,
                enqueued_at=time.time(),
            )
            started = time.perf_counter()
            result = retriever.run([request], picked_at=time.time())
            took = time.perf_counter() - started
            [sources] = [e.sources for _, e in result.events if isinstance(e, Sources)] or [[]]
            return Answer(sources, took)

        return ask


class OverHttp:
    """A running API, asked with plain JSON requests."""

    def __init__(self, url: str, index: str, *, top_k: int, api_key: str | None, rag: bool) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=300)
        self._index = index
        self._top_k = top_k
        self._rag = rag

    def asker(self, config: Config) -> Ask:
        if config.overrides:
            raise ValueError(f"{config.name}: settings overrides need --in-process")

        def ask(question: str) -> Answer:
            body: dict[str, Any] = {
                "query": question,
                "index": self._index,
                "top_k": self._top_k,
                "mode": "rag" if self._rag else "retrieval",
            }
            if config.mode is not None:
                body["retrieval"] = config.mode
            if not config.diversity:
                body["diversity"] = False
            started = time.perf_counter()
            reply = self._client.post("/v1/query", json=body)
            took = time.perf_counter() - started
            if reply.status_code != 200:
                raise RuntimeError(f"{reply.status_code} from the API: {reply.text[:300]}")
            data = reply.json()
            sources = [Source.model_validate(s) for s in data.get("sources", [])]
            answer = data.get("answer") if self._rag else None
            cited = len(data.get("citations") or []) or len(_CITATION.findall(answer or ""))
            return Answer(sources, took, text=answer, cited=cited)

        return ask


def evaluate(
    sets: dict[str, list[Label]], configs: Sequence[Config], make_ask: Callable[[Config], Ask]
) -> dict[str, dict[str, dict[str, float]]]:
    """{set: {configuration: figures}}."""
    results: dict[str, dict[str, dict[str, float]]] = {name: {} for name in sets}
    for config in configs:
        ask = make_ask(config)
        for name, labels in sets.items():
            results[name][config.name] = score(labels, [ask(label.question) for label in labels])
    return results


def render(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = []
    for name, by_config in results.items():
        columns = list(next(iter(by_config.values())))
        lines.append(f"\n{name}")
        lines.append("| configuration | " + " | ".join(columns) + " |")
        lines.append("|---|" + "---|" * len(columns))
        for config, figures in by_config.items():
            cells = [f"{figures[c]:.1f}" if c == "p50_ms" else f"{figures[c]:.3f}" for c in columns]
            lines.append(f"| {config} | " + " | ".join(cells) + " |")
    rounded = {
        n: {c: {k: round(v, 4) for k, v in f.items()} for c, f in b.items()} for n, b in results.items()
    }
    lines.append(json.dumps(rounded, separators=(",", ":")))
    return "\n".join(lines)
