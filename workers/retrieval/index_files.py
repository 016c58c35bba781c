"""FAISS indexes on disk: versioned folders written aside and renamed into place.

Layout: ``<home>/indexes/<name>/<version>/{index.faiss, lexical/, chunks.jsonl,
documents.jsonl, meta.json}`` and ``<name>/CURRENT`` naming the live version. The dense (FAISS)
and lexical (BM25) indexes of a version are written together, so they are swapped together.
Readers load whole files, so an older version can be removed once a newer one is current; the
previous one is kept for a quick rollback. A version written before lexical indexes existed gets
one built when it is loaded.

A document's metadata is stored once, in ``documents.jsonl`` (``{"id", "meta"}`` a line), and
each row of ``chunks.jsonl`` names its document (``"document"``); loaded, the chunks of a document
share one mapping. Versions written before that (each row with its own ``"meta"``) load as they
are, their rows' equal metadata shared the same way, and are written in this layout by the next
ingest that builds on them. A version in this layout is not read by releases before it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
from ragline.broker.contract.records import IndexInfo
from ragline.broker.state import indexes, shards
from ragline.workers.retrieval import ondisk
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.lexical import LexicalIndex
from ragline.workers.retrieval.loaded_index import LoadedIndex

log = logging.getLogger(__name__)

_KEEP_VERSIONS = 2
_CHUNKS = "chunks.jsonl"
_DOCUMENTS = "documents.jsonl"
# What save() names a version: pruning removes only folders named so, nothing else.
_VERSION_NAME = re.compile(r"\d{8}T\d{12}Z-[0-9a-f]{6}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(
    root: Path,
    name: str,
    index: faiss.Index,
    chunks: list[Chunk],
    *,
    index_type: str = "hnsw",
    lexical: LexicalIndex | None = None,
) -> IndexInfo:
    """Persist a new version of ``name`` and make it CURRENT; returns its description."""
    indexes.check_index_name(name)  # a folder of root's own, never a path out of it
    # Sortable to the microsecond: pruning keeps the newest by name.
    version = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:6]
    base = root / name
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".tmp-{version}"
    staging.mkdir()
    if index_type == "ivfpq-disk":
        ondisk.move_lists_to_disk(index, staging)
    faiss.write_index(index, str(staging / "index.faiss"))
    if lexical is not None:
        lexical.save(staging / "lexical")
    _write_chunks(staging, chunks)
    info = IndexInfo(
        name=name,
        version=version,
        path=str(base / version),
        chunks=len(chunks),
        dim=index.d,
        index_type=index_type,
    )
    (staging / "meta.json").write_text(info.encode())
    staging.rename(base / version)
    _write_atomic(base / "CURRENT", version)
    _prune(base, keep=version)
    return info


def _prune(base: Path, *, keep: str) -> None:
    versions = sorted(
        p for p in base.iterdir() if _VERSION_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    )
    for old in versions[:-_KEEP_VERSIONS]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def discard_version(root: Path, name: str, version: str, *, current: str | None) -> None:
    """Undo a save of ``version`` that was never registered: CURRENT names ``current`` again
    (the version still registered; None: CURRENT is removed) and the version's folder goes."""
    base = root / name
    if current is not None and (base / current).is_dir():
        _write_atomic(base / "CURRENT", current)
    else:
        (base / "CURRENT").unlink(missing_ok=True)
    shutil.rmtree(base / version, ignore_errors=True)


def remove_index(root: Path, name: str) -> None:
    """Every file of index ``name``: CURRENT first, so that no worker re-registers it meanwhile."""
    indexes.check_index_name(name)
    base = root / name
    (base / "CURRENT").unlink(missing_ok=True)
    shutil.rmtree(base, ignore_errors=True)


def read_version(info: IndexInfo) -> tuple[faiss.Index, list[Chunk]]:
    """A version's FAISS index and chunks, row for row (what an ingest builds the next one from)."""
    return _read_index(info), _read_chunks(Path(info.path))


def _write_chunks(folder: Path, chunks: list[Chunk]) -> None:
    """``chunks.jsonl``, a row per chunk naming its document, and ``documents.jsonl``, each
    document's metadata once. A chunk whose metadata is not its document's (chunks built by hand)
    keeps its own on its row."""
    documents: dict[str, Mapping[str, str]] = {}
    with (folder / _CHUNKS).open("w") as out:
        for chunk in chunks:
            row: dict[str, object] = {
                "chunk_id": chunk.chunk_id,
                "source": chunk.source,
                "title": chunk.title,
                "text": chunk.text,
                "anchors": list(chunk.anchors),
            }
            held = documents.setdefault(chunk.document_id, chunk.meta)
            if held is chunk.meta or held == chunk.meta:
                row["document"] = chunk.document_id
            else:
                row["meta"] = dict(chunk.meta)
            out.write(json.dumps(row) + "\n")
    with (folder / _DOCUMENTS).open("w") as out:
        for doc_id, meta in documents.items():
            out.write(json.dumps({"id": doc_id, "meta": dict(meta)}) + "\n")


def _read_chunks(folder: Path) -> list[Chunk]:
    """A version's chunks, row for row, the chunks of each document sharing one metadata mapping
    (this layout's or the one before it: see the module's docstring)."""
    documents: dict[str, dict[str, str]] = {}
    if (folder / _DOCUMENTS).exists():
        for row in _rows(folder / _DOCUMENTS):
            documents[row["id"]] = row["meta"]
    # A section's chunks carry the same title path: one string in memory, not one per chunk.
    titles: dict[str, str] = {}
    chunks = []
    for row in _rows(folder / _CHUNKS):
        anchors = tuple(row.pop("anchors", ()))
        title = row.pop("title")
        if "document" in row:
            meta = documents[row.pop("document")]
        else:
            # Each row with its own metadata (the layout before documents.jsonl, or none at all
            # before section-aware chunking): equal ones of a document are held once all the same.
            own = row.pop("meta", None) or {}
            held = documents.setdefault(own.get("path") or row["source"], own)
            meta = held if held == own else own
        chunks.append(Chunk(**row, title=titles.setdefault(title, title), anchors=anchors, meta=meta))
    return chunks


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as src:
        for line in src:
            yield json.loads(line)


def _read_index(info: IndexInfo) -> faiss.Index:
    return read_faiss(Path(info.path), info.index_type)


def read_faiss(folder: Path, index_type: str) -> faiss.Index:
    """The FAISS index saved in a version's ``folder``, as a worker serves it."""
    if index_type == "ivfpq-disk":
        return ondisk.read(folder)
    return faiss.read_index(str(folder / "index.faiss"))


def current_on_disk(root: Path) -> list[IndexInfo]:
    """Every index's CURRENT version found on disk (to re-register after a Redis restart)."""
    found = []
    for current in sorted(root.glob("*/CURRENT")):
        meta = current.parent / current.read_text().strip() / "meta.json"
        if meta.exists():
            found.append(IndexInfo.decode(meta.read_text()))
    return found


_SHARD_MAP = "SHARDS.json"


def write_shard_map(root: Path, shard_map: shards.ShardMap) -> None:
    """A sharded index's map beside its shards (``<name>/SHARDS.json``), so a worker can register
    it again after Redis lost the registry."""
    base = root / shards.check_logical_name(shard_map.index)
    base.mkdir(parents=True, exist_ok=True)
    _write_atomic(base / _SHARD_MAP, shard_map.encode())


def shard_maps_on_disk(root: Path) -> list[shards.ShardMap]:
    return [shards.ShardMap.decode(p.read_text()) for p in sorted(root.glob(f"*/{_SHARD_MAP}"))]


def load(info: IndexInfo, *, ef_search: int) -> LoadedIndex:
    path = Path(info.path)
    index = _read_index(info)
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search
    chunks = _read_chunks(path)
    if (path / "lexical").is_dir():
        lexical = LexicalIndex.load(path / "lexical", len(chunks))
    else:
        log.info("index %s version %s has no lexical index: building one", info.name, info.version)
        lexical = LexicalIndex.build([c.embed_text for c in chunks])
    return LoadedIndex(info=info, index=index, chunks=chunks, lexical=lexical)
