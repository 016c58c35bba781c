"""Cut a document's sections into chunks along its structure, with deterministic ids.

A chunk holds blocks of one section, packed up to ``chunk_words``; it spans two sections only
when both are short descriptions (under ``min_words`` each: a run of one-line ``.. data::``
constants becomes one chunk; headed sections, FAQ answers among them, always stand alone). A
paragraph longer than a chunk is cut into windows overlapping by ``overlap_words``, and when a
section takes several chunks each begins with the tail of the previous one's last paragraph. A
code block is kept whole unless it alone is over twice ``chunk_words``, and is then cut between
lines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from workers.retrieval.readers import Block, Section


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str
    source: str
    # The title path: "Simple statements › The global statement".
    title: str
    text: str
    # The anchor of each section it holds, its own first.
    anchors: tuple[str, ...] = ()
    # The file's path under what was ingested, its front matter, and `ragline ingest --meta`.
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        return self.anchors[0] if self.anchors else ""

    @property
    def section_key(self) -> tuple[str, str]:
        return (self.source, self.anchor)

    @property
    def embed_text(self) -> str:
        """What is embedded and indexed: the title path, then the text."""
        return f"{self.title}\n{self.text}"


def _words(block: Block) -> int:
    return len(block.text.split())


def _validate(chunk_words: int, overlap_words: int) -> None:
    if chunk_words < 1:
        raise ValueError(f"chunk_words must be >= 1, got {chunk_words}")
    if overlap_words < 0:
        raise ValueError(f"overlap_words must be >= 0, got {overlap_words}")
    if overlap_words >= chunk_words:
        raise ValueError(f"overlap_words ({overlap_words}) must be < chunk_words ({chunk_words})")


def _windows(block: Block, chunk_words: int, overlap_words: int) -> Iterator[Block]:
    """A paragraph in overlapping word windows; a long code block in runs of whole lines."""
    if block.code:
        if _words(block) <= 2 * chunk_words:
            yield block
            return
        lines: list[str] = []
        count = 0
        for line in block.text.split("\n"):
            n = len(line.split())
            if lines and count + n > chunk_words:
                yield Block("\n".join(lines), code=True)
                lines, count = [], 0
            lines.append(line)
            count += n
        if lines:
            yield Block("\n".join(lines), code=True)
        return
    words = block.text.split()
    if not words:
        return
    step = chunk_words - overlap_words
    start = 0
    while True:
        yield Block(" ".join(words[start : start + chunk_words]))
        # Stop once a window reaches the end: the next one would only repeat its tail.
        if start + chunk_words >= len(words):
            return
        start += step


def _groups(sections: list[Section], min_words: int, chunk_words: int) -> Iterator[list[Section]]:
    """Sections one by one, but runs of short descriptions (each under ``min_words``) together."""
    run: list[Section] = []
    run_words = 0
    for section in sections:
        words = sum(_words(b) for b in section.blocks)
        short = section.description and words < min_words
        if run and (not short or run_words + words > chunk_words):
            yield run
            run, run_words = [], 0
        if not short:
            yield [section]
            continue
        run.append(section)
        run_words += words
    if run:
        yield run


def chunk_sections(
    sections: Iterable[Section],
    *,
    source: str,
    chunk_words: int,
    overlap_words: int,
    min_words: int = 0,
    meta: dict[str, str] | None = None,
) -> list[Chunk]:
    """Chunks of ``sections`` (one document's). Ids are ``{sha1(source)[:10]}-{n:05d}`` with
    ``n`` counting from 0 across the document, so re-ingesting an unchanged one gives the same ids."""
    _validate(chunk_words, overlap_words)
    prefix = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]
    chunks: list[Chunk] = []

    def emit(title: str, anchors: tuple[str, ...], blocks: list[Block]) -> None:
        text = "\n\n".join(b.text for b in blocks)
        chunks.append(Chunk(f"{prefix}-{len(chunks):05d}", source, title, text, anchors, dict(meta or {})))

    for group in _groups(list(sections), min_words, chunk_words):
        if len(group) > 1:
            # Short sections together: each after the first keeps its heading in the text.
            blocks = list(group[0].blocks)
            for s in group[1:]:
                blocks += [Block(s.title), *s.blocks]
            emit(group[0].path_title, tuple(s.anchor for s in group), blocks)
            continue
        [section] = group
        anchors = (section.anchor,)
        current: list[Block] = []
        count = 0
        for block in section.blocks:
            for i, unit in enumerate(_windows(block, chunk_words, overlap_words)):
                n = _words(unit)
                if current and count + n > chunk_words:
                    emit(section.path_title, anchors, current)
                    # A paragraph's next window overlaps its previous one already.
                    tail = _tail(current[-1], overlap_words) if i == 0 else None
                    fits = tail is not None and _words(tail) + n <= chunk_words
                    current, count = ([tail], _words(tail)) if tail is not None and fits else ([], 0)
                current.append(unit)
                count += n
        if current:
            emit(section.path_title, anchors, current)
    return chunks


def _tail(block: Block, overlap_words: int) -> Block | None:
    """The end of a paragraph that the next chunk of its section repeats (code is not repeated)."""
    if block.code or overlap_words == 0:
        return None
    return Block(" ".join(block.text.split()[-overlap_words:]))
