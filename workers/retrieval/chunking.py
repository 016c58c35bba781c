"""Split document sections into overlapping word windows with deterministic ids."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from workers.retrieval.readers import Section


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str
    source: str
    title: str
    text: str


def chunk_sections(
    sections: Iterable[Section], *, source: str, chunk_words: int, overlap_words: int
) -> list[Chunk]:
    """Cut each section into windows of ``chunk_words`` words overlapping by ``overlap_words``.

    Windows never span sections. Ids are ``{sha1(source)[:10]}-{n:05d}`` with ``n`` counting from 0
    across the whole document, so re-ingesting an unchanged document yields the same ids.
    """
    if chunk_words < 1:
        raise ValueError(f"chunk_words must be >= 1, got {chunk_words}")
    if overlap_words < 0:
        raise ValueError(f"overlap_words must be >= 0, got {overlap_words}")
    if overlap_words >= chunk_words:
        raise ValueError(f"overlap_words ({overlap_words}) must be < chunk_words ({chunk_words})")
    prefix = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]
    step = chunk_words - overlap_words
    chunks: list[Chunk] = []
    for section in sections:
        words = section.text.split()
        start = 0
        while words:
            window = words[start : start + chunk_words]
            chunks.append(Chunk(f"{prefix}-{len(chunks):05d}", source, section.title, " ".join(window)))
            # Stop once a window reaches the end: the next one would only repeat its tail.
            if start + chunk_words >= len(words):
                break
            start += step
    return chunks
