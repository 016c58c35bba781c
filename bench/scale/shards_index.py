"""bench/scale/shards.py's indexes: the synthetic corpus as ragline indexes a worker serves, one
plain and one sharded by hash for each shard count, without embedding any text.

Each vector becomes a chunk with a placeholder text (the searches are dense: nothing reads the
text but the lexical index, which must exist, or a worker would build it at every start) and
belongs to a document of :data:`CHUNKS_PER_DOCUMENT` consecutive rows, so a shard takes whole
documents as an ingest's would, and the document lists stay short. The chunks are split as
``ragline ingest --shards N`` splits them (``sharded_ingest.split``: the hash of the document
id), each shard saved as a version of its own index (``index_store.save``) and the map beside
them, so a worker serves them as it would an ingested index. The plain index and the one-shard
index reuse the HNSW index bench/scale/index.py built for the same corpus (the same vectors, in
the same order); the others are built here, a corpus block at a time.

Cached in a RAGLINE_HOME of their own (:func:`served_home`), each logical index with its build
time in ``built.json``, written once it is complete. Run in a process of its own
(``python -m bench.scale.shards_index``), so that the measuring process never holds an index.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import faiss
import numpy as np
import redis
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.broker.contract import records
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.ingest import record_counts
from ragline.workers.retrieval.lexical import LexicalIndex
from ragline.workers.retrieval.sharded_ingest import key_order, register_sharded, split

from bench.scale.data import Corpus
from bench.scale.index import ensure_built, hnsw_params, index_key

PLAIN = "scale"
SHARD_COUNTS = (1, 2, 4)
CHUNKS_PER_DOCUMENT = 100
_TEXT = "synthetic vector"
_BUILT = "built.json"


def sharded_name(count: int) -> str:
    """The sharded index of ``count`` shards: ``scale4`` has ``scale4.shard-0`` to ``-3``."""
    return f"{PLAIN}{count}"


def served_home(root: Path, corpus: Corpus, settings: RetrievalSettings) -> Path:
    """A RAGLINE_HOME per corpus and HNSW build parameters, under the scale benchmark's cache."""
    return root / f"served-{index_key('hnsw', corpus, settings)}"


def placeholder_chunks(first: int, count: int) -> list[Chunk]:
    """Rows ``first`` to ``first + count`` as chunks: ids ``v<row>``, documents ``doc-<row // 100>``."""
    chunks = []
    for row in range(first, first + count):
        document = f"doc-{row // CHUNKS_PER_DOCUMENT}"
        chunks.append(
            Chunk(chunk_id=f"v{row}", source=document, title="synthetic", text=_TEXT, meta={"path": document})
        )
    return chunks


def row_of(chunk: Chunk) -> int:
    return int(chunk.chunk_id[1:])


def shard_of_rows(chunks: list[Chunk], count: int) -> np.ndarray:
    """Each row's shard number, as ``ragline ingest --shards count`` would split the chunks."""
    parts = split(chunks, index=sharded_name(count), count=count, shard_by=None)
    if len(parts) < count:  # an empty shard has no index to serve
        documents = -(-len(chunks) // CHUNKS_PER_DOCUMENT)
        raise ValueError(f"{documents} documents left a shard of {count} empty: use a larger corpus")
    of = np.full(len(chunks), -1, dtype=np.int64)
    for key, part in parts.items():
        of[[row_of(c) for c in part]] = int(key)
    assert (of >= 0).all()
    return of


def built_times(home: Path) -> dict[str, float]:
    """Seconds each complete logical index took to build (the HNSW index reused included)."""
    path = home / _BUILT
    return json.loads(path.read_text()) if path.exists() else {}


def _record(home: Path, name: str, seconds: float) -> None:
    done = built_times(home) | {name: seconds}
    (home / _BUILT).write_text(json.dumps(done))


def _save(settings: Settings, name: str, index: faiss.Index, chunks: list[Chunk]) -> records.IndexInfo:
    lexical = LexicalIndex.build([c.embed_text for c in chunks])
    info = index_store.save(settings.indexes_dir, name, index, chunks, index_type="hnsw", lexical=lexical)
    return record_counts(info, chunks)


def build_plain_and_one_shard(settings: Settings, root: Path, corpus: Corpus, chunks: list[Chunk]) -> float:
    """The plain index and the one-shard index, both the HNSW index of bench/scale/index.py."""
    built = ensure_built(root, "hnsw", corpus, settings.retrieval)
    started = time.perf_counter()
    index = faiss.read_index(str(built.folder / "index.faiss"))
    _save(settings, PLAIN, index, chunks)
    _save(settings, shards.shard_index(sharded_name(1), "0"), index, chunks)
    index_store.write_shard_map(settings.indexes_dir, _map(1))
    return built.build_s + time.perf_counter() - started


def build_sharded(settings: Settings, corpus: Corpus, chunks: list[Chunk], count: int) -> float:
    """``count`` HNSW shards, each filled a corpus block at a time with the rows hashed to it."""
    started = time.perf_counter()
    of = shard_of_rows(chunks, count)
    parts = [index_store.empty_hnsw(corpus.dim, hnsw_params(settings.retrieval)) for _ in range(count)]
    for first, rows in corpus.blocks():
        mine = of[first : first + len(rows)]
        for key, index in enumerate(parts):
            index.add(np.ascontiguousarray(rows[mine == key]))
        print(f"  {sharded_name(count)}: {first + len(rows)}/{corpus.n} added", flush=True)
    for key, index in enumerate(parts):
        shard_chunks = [c for c, k in zip(chunks, of, strict=True) if k == key]
        _save(settings, shards.shard_index(sharded_name(count), str(key)), index, shard_chunks)
    index_store.write_shard_map(settings.indexes_dir, _map(count))
    return time.perf_counter() - started


def _map(count: int) -> shards.ShardMap:
    keys = tuple(sorted((str(k) for k in range(count)), key=key_order))
    return shards.ShardMap(index=sharded_name(count), shard_by=None, keys=keys, count=count)


def ensure_indexes(root: Path, corpus: Corpus, settings: Settings) -> dict[str, float]:
    """Every index the measurement serves, from the cache or built now; their build times."""
    settings = settings.replace(home=served_home(root, corpus, settings.retrieval))
    settings.indexes_dir.mkdir(parents=True, exist_ok=True)
    done = built_times(settings.home)
    wanted = [PLAIN, *(sharded_name(c) for c in SHARD_COUNTS)]
    if all(name in done for name in wanted):
        return done
    chunks = placeholder_chunks(0, corpus.n)
    if PLAIN not in done or sharded_name(1) not in done:
        seconds = build_plain_and_one_shard(settings, root, corpus, chunks)
        _record(settings.home, PLAIN, seconds)
        _record(settings.home, sharded_name(1), seconds)
    for count in SHARD_COUNTS[1:]:
        if sharded_name(count) not in built_times(settings.home):
            _record(settings.home, sharded_name(count), build_sharded(settings, corpus, chunks, count))
    return built_times(settings.home)


def register_all(client: redis.Redis, keys: Keys, indexes_dir: Path) -> None:
    """Every index on disk in the registry, and the sharded ones' maps, as a worker would after
    Redis lost them; done before the API and workers start, so none of them races it."""
    for info in index_store.current_on_disk(indexes_dir):
        indexes.register(client, keys, info)
    for shard_map in index_store.shard_maps_on_disk(indexes_dir):
        register_sharded(client, keys, indexes_dir, shard_map)


def build_command(root: Path, corpus: Corpus) -> list[str]:
    cmd = [sys.executable, "-m", "bench.scale.shards_index", str(root)]
    return cmd + [f"--{name}={value}" for name, value in asdict(corpus).items()]


def main() -> int:
    parser = argparse.ArgumentParser(description="Build bench/scale/shards.py's indexes into the cache.")
    parser.add_argument("root", type=Path)
    for name, kind in (("n", int), ("dim", int), ("clusters", int), ("spread", float), ("seed", int)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    args = parser.parse_args()
    corpus = Corpus(n=args.n, dim=args.dim, clusters=args.clusters, spread=args.spread, seed=args.seed)
    ensure_indexes(args.root, corpus, Settings())
    return 0


if __name__ == "__main__":
    sys.exit(main())
