"""Cut a document's sections into chunks along its structure, with deterministic ids.

A chunk holds blocks of one section, packed up to ``chunk_words``; it spans two sections only
when both are short descriptions (under ``min_words`` each: a run of one-line ``.. data::``
constants becomes one chunk; headed sections, FAQ answers among them, always stand alone). A
paragraph longer than a chunk is cut into windows overlapping by ``overlap_words``, and when a
section takes several chunks each begins with the tail of the previous one's last paragraph. A
code block is kept whole unless it alone is over twice ``chunk_words``, and is then cut between
lines.

Whatever the words, a chunk's text is at most ``max_chars`` characters: a paragraph or code block
longer than that is cut between words or lines, and a "word" or line longer than that (a run with
no spaces, a script written without them) is cut where it reaches it. Its title path is bounded
too: each heading at ``title_max_chars``, the path at ``title_path_max_chars`` (the headings
above dropped first). Every chunk of a document shares one mapping of its metadata.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ragline.broker.config.settings import RetrievalSettings
from ragline.broker.limits.metadata import MetadataLimits, check_metadata
from ragline.workers.retrieval.readers import TITLE_SEPARATOR, Block, Document, Section

# Between a chunk's blocks.
_JOIN = "\n\n"
# Marks a heading cut short, and where a title path's outer headings were dropped.
_ELLIPSIS = "…"


def _default(name: str) -> int:
    default = RetrievalSettings.model_fields[name].default
    assert isinstance(default, int)
    return default


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str
    source: str
    # The title path: "Simple statements › The global statement".
    title: str
    text: str
    # The anchor of each section it holds, its own first.
    anchors: tuple[str, ...] = ()
    # Its document's metadata: the file's path under what was ingested (or the id it was uploaded
    # with), its front matter, and upload metadata or `ragline ingest --meta`. One mapping shared
    # by every chunk of the document, and stored once per document (index_files.py); not to be
    # changed in place.
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        return self.anchors[0] if self.anchors else ""

    @property
    def document_id(self) -> str:
        """The document it belongs to: its ``path`` (its file under what was ingested, or the id
        it was uploaded with), else its source."""
        return self.meta.get("path") or self.source

    @property
    def section_key(self) -> tuple[str, str]:
        return (self.source, self.anchor)

    @property
    def embed_text(self) -> str:
        """What is embedded and indexed: the title path, then the text."""
        return f"{self.title}\n{self.text}"


def _words(block: Block) -> int:
    return len(block.text.split())


def _validate(chunk_words: int, overlap_words: int, max_chars: int) -> None:
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
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


def _cuts(text: str, max_chars: int) -> Iterator[str]:
    """``text`` in slices of at most ``max_chars`` characters (an empty text: itself)."""
    for start in range(0, max(len(text), 1), max_chars):
        yield text[start : start + max_chars]


def _fit(block: Block, max_chars: int) -> Iterator[Block]:
    """``block`` in pieces of at most ``max_chars`` characters: prose cut between words, code
    between lines, and a word or a line longer than that cut where it reaches it."""
    if len(block.text) <= max_chars:
        yield block
        return
    sep = "\n" if block.code else " "
    parts = block.text.split("\n") if block.code else block.text.split()
    piece: list[str] = []
    size = 0
    for part in parts:
        for cut in _cuts(part, max_chars):
            if piece and size + len(sep) + len(cut) > max_chars:
                yield Block(sep.join(piece), code=block.code)
                piece, size = [], 0
            size += len(cut) + (len(sep) if piece else 0)
            piece.append(cut)
    if piece:
        yield Block(sep.join(piece), code=block.code)


def capped(text: str, max_chars: int) -> str:
    """``text``, or its first ``max_chars`` characters with the last one an ellipsis."""
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1].rstrip() + _ELLIPSIS


def title_path(headings: tuple[str, ...], *, heading_chars: int, path_chars: int) -> str:
    """The title path of a section under ``headings`` (outermost first), each heading capped at
    ``heading_chars``; past ``path_chars`` the outer headings give way to an ellipsis, its own
    heading last to go: "… › Descriptor HowTo Guide › Pure Python Equivalents"."""
    kept = [capped(h, heading_chars) for h in headings]
    title = TITLE_SEPARATOR.join(kept)
    while len(title) > path_chars and len(kept) > 1:
        kept = kept[1:]
        title = TITLE_SEPARATOR.join([_ELLIPSIS, *kept])
    return capped(title, path_chars)


def _section_chars(section: Section, heading_chars: int) -> int:
    """The most characters ``section`` adds to a chunk of short sections: its heading and text."""
    return len(capped(section.title, heading_chars)) + len(section.text) + 2 * len(_JOIN)


def _groups(
    sections: list[Section], min_words: int, chunk_words: int, max_chars: int, heading_chars: int
) -> Iterator[list[Section]]:
    """Sections one by one, but runs of short descriptions (each under ``min_words``) together,
    up to ``chunk_words`` and ``max_chars``."""
    run: list[Section] = []
    run_words = 0
    run_chars = 0
    for section in sections:
        words = sum(_words(b) for b in section.blocks)
        chars = _section_chars(section, heading_chars)
        short = section.description and words < min_words and chars <= max_chars
        if run and (not short or run_words + words > chunk_words or run_chars + chars > max_chars):
            yield run
            run, run_words, run_chars = [], 0, 0
        if not short:
            yield [section]
            continue
        run.append(section)
        run_words += words
        run_chars += chars
    if run:
        yield run


def chunk_sections(
    sections: Iterable[Section],
    *,
    source: str,
    chunk_words: int,
    overlap_words: int,
    min_words: int = 0,
    meta: Mapping[str, str] | None = None,
    max_chars: int = _default("chunk_max_chars"),
    title_max_chars: int = _default("title_max_chars"),
    title_path_max_chars: int = _default("title_path_max_chars"),
) -> list[Chunk]:
    """Chunks of ``sections`` (one document's), each with ``meta`` (one mapping, shared). Ids
    are ``{sha1(source)[:10]}-{n:05d}`` with ``n`` counting from 0 across the document, so
    re-ingesting an unchanged one gives the same ids."""
    _validate(chunk_words, overlap_words, max_chars)
    prefix = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]
    shared = dict(meta or {})
    chunks: list[Chunk] = []

    def emit(section: Section, anchors: tuple[str, ...], blocks: list[Block]) -> None:
        text = _JOIN.join(b.text for b in blocks)
        title = title_path(section.title_path, heading_chars=title_max_chars, path_chars=title_path_max_chars)
        # An anchor is the slug of a heading: as long as the heading, so bounded as it is.
        bounded = tuple(a[:title_max_chars] for a in anchors)
        chunks.append(Chunk(f"{prefix}-{len(chunks):05d}", source, title, text, bounded, shared))

    for group in _groups(list(sections), min_words, chunk_words, max_chars, title_max_chars):
        if len(group) > 1:
            # Short sections together: each after the first keeps its heading in the text.
            blocks = list(group[0].blocks)
            for s in group[1:]:
                blocks += [Block(capped(s.title, title_max_chars)), *s.blocks]
            emit(group[0], tuple(s.anchor for s in group), blocks)
            continue
        [section] = group
        anchors = (section.anchor,)
        current: list[Block] = []
        count = 0  # words in current
        size = 0  # characters of current's text
        for block in section.blocks:
            units = (
                piece
                for window in _windows(block, chunk_words, overlap_words)
                for piece in _fit(window, max_chars)
            )
            for i, unit in enumerate(units):
                n, chars = _words(unit), len(unit.text)
                if current and (count + n > chunk_words or size + len(_JOIN) + chars > max_chars):
                    emit(section, anchors, current)
                    # A paragraph's next window (or piece) overlaps its previous one already.
                    tail = _tail(current[-1], overlap_words) if i == 0 else None
                    fits = (
                        tail is not None
                        and _words(tail) + n <= chunk_words
                        and len(tail.text) + len(_JOIN) + chars <= max_chars
                    )
                    if tail is not None and fits:
                        current, count, size = [tail], _words(tail), len(tail.text)
                    else:
                        current, count, size = [], 0, 0
                size = chars if not current else size + len(_JOIN) + chars
                current.append(unit)
                count += n
        if current:
            emit(section, anchors, current)
    return chunks


def _tail(block: Block, overlap_words: int) -> Block | None:
    """The end of a paragraph that the next chunk of its section repeats (code is not repeated)."""
    if block.code or overlap_words == 0:
        return None
    return Block(" ".join(block.text.split()[-overlap_words:]))


@dataclass(frozen=True, slots=True)
class ChunkShape:
    """How a document is cut into chunks and what bounds them: RetrievalSettings' chunking,
    title and metadata fields, as one plain value (a reader in another process gets it whole)."""

    chunk_words: int
    overlap_words: int
    min_words: int
    max_chars: int
    title_max_chars: int
    title_path_max_chars: int
    metadata: MetadataLimits

    @classmethod
    def of(cls, settings: RetrievalSettings) -> ChunkShape:
        return cls(
            chunk_words=settings.chunk_words,
            overlap_words=settings.chunk_overlap_words,
            min_words=settings.chunk_min_words,
            max_chars=settings.chunk_max_chars,
            title_max_chars=settings.title_max_chars,
            title_path_max_chars=settings.title_path_max_chars,
            metadata=MetadataLimits.of(settings),
        )


def chunk_document(
    document: Document, *, source: str, path: str, metadata: Mapping[str, str], shape: ChunkShape
) -> list[Chunk]:
    """The chunks of a read document. Its metadata is its front matter and ``metadata`` (an
    upload's, or `ragline ingest --meta`; they win), checked against the limits
    (MetadataRefused names the one passed), then ``path``: its file under what was ingested, or
    the id it was uploaded with."""
    merged = check_metadata(
        {**document.meta, **metadata}, shape.metadata, what=f"the metadata of document {path[:256]!r}"
    )
    return chunk_sections(
        document.sections,
        source=source,
        chunk_words=shape.chunk_words,
        overlap_words=shape.overlap_words,
        min_words=shape.min_words,
        meta={**merged, "path": path},
        max_chars=shape.max_chars,
        title_max_chars=shape.title_max_chars,
        title_path_max_chars=shape.title_path_max_chars,
    )
