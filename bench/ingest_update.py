"""What adding one document costs an index of N chunks, as the ingest worker does it (the kept
chunks' vectors copied out of the HNSW index, only the new chunks embedded), against building the
same version with every chunk embedded (what an index that keeps no vectors, IVF-PQ, pays when its
embedding cache has none of them).

``.venv/bin/python -m bench.ingest_update [--documents 200] [--redis-url redis://127.0.0.1:6379/0]``
In process, on a key prefix and a home folder of its own (both removed after); one run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import redis
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.broker.contract.messages import IngestProgress
from ragline.broker.redis.keys import Keys
from ragline.workers.ingest import build
from ragline.workers.retrieval.chunking import chunk_sections
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.readers import read_document


def _document(i: int) -> str:
    words = " ".join(f"term{(i * 31 + j) % 997}" for j in range(380))
    return f"# Note {i}\n\nSection about topic {i}. {words}\n"


def _change(settings: RetrievalSettings, folder: Path, ids: range) -> build.Change:
    chunks = []
    for i in ids:
        path = folder / f"note-{i:04d}.md"
        path.write_text(_document(i))
        doc = read_document(path)
        chunks += chunk_sections(
            doc.sections,
            source=path.name,
            chunk_words=settings.chunk_words,
            overlap_words=settings.chunk_overlap_words,
            min_words=settings.chunk_min_words,
            meta={"path": path.name},
        )
    names = [f"note-{i:04d}.md" for i in ids]
    return build.Change(add=chunks, added_ids=names, drop=frozenset(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        settings = Settings().replace(
            redis_url=args.redis_url,
            home=Path(home),
            key_prefix=f"bench-ingest-{uuid.uuid4().hex[:6]}",
        )
        prefix = settings.redis.key_prefix
        client, keys = redis.Redis.from_url(settings.redis.redis_url), Keys(prefix)
        embedder = Embedder(settings.retrieval)
        embedder.encode(["warm up"])
        folder = Path(home) / "docs"
        folder.mkdir()

        def report(_: IngestProgress) -> bool:
            return True

        try:
            n = args.documents
            first = build.next_version(
                settings,
                client,
                keys,
                embedder,
                index="a",
                change=_change(settings.retrieval, folder, range(n)),
                report=report,
            )
            started = time.perf_counter()
            added = build.next_version(
                settings,
                client,
                keys,
                embedder,
                index="a",
                change=_change(settings.retrieval, folder, range(n, n + 1)),
                report=report,
            )
            reuse_s = time.perf_counter() - started
            started = time.perf_counter()
            # Keys of its own: an empty embedding cache, so every chunk is encoded.
            whole = build.next_version(
                settings,
                client,
                Keys(prefix + "-b"),
                embedder,
                index="b",
                change=_change(settings.retrieval, folder, range(n + 1)),
                report=report,
            )
            whole_s = time.perf_counter() - started
        finally:
            for key in client.scan_iter(f"{prefix}*"):
                client.delete(key)
    print(
        f"index of {first.chunks} chunks ({n} documents), one document added ({added.embedded} new chunks):"
    )
    print(f"  vectors reused: {reuse_s:.2f} s, {added.embedded} embedded, {added.reused} reused")
    print(f"  every chunk embedded: {whole_s:.2f} s, {whole.embedded} embedded")
    print(f"  reuse takes {reuse_s / whole_s:.2f} of the time")


if __name__ == "__main__":
    main()
