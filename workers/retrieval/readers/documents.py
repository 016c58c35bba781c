"""Which reader reads a file (by its name's ending), and the document it makes of it.

A JSON document (``{"id", "text", "format"}`` in an upload) is staged as a file named by its
format (``txt`` by default), so it is read here like any uploaded file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ragline.broker.contract.messages import DOCUMENT_SUFFIXES, document_type
from ragline.workers.retrieval.readers.front_matter import split_front_matter
from ragline.workers.retrieval.readers.html import read_html
from ragline.workers.retrieval.readers.markdown import read_markdown
from ragline.workers.retrieval.readers.rest import read_plain_text, read_rest
from ragline.workers.retrieval.readers.sections import Document, RawSection, Section, build_sections

SUPPORTED_SUFFIXES: tuple[str, ...] = DOCUMENT_SUFFIXES

_READERS: dict[str, Callable[[str], list[RawSection]]] = {
    ".txt": read_plain_text,
    ".md": read_markdown,
    ".rst": read_rest,
    ".rst.txt": read_rest,
    ".html": read_html,
    ".htm": read_html,
}


def is_supported(path: Path) -> bool:
    """Whether ``read_sections`` can read ``path`` (by its lowercased name ending)."""
    return _kind(path) is not None


def read_document(path: Path) -> Document:
    """Read ``path`` into sections in document order (sections without text dropped) and its
    front matter.

    Raises ``ValueError`` for an unsupported suffix and ``OSError`` if the file cannot be
    read; malformed content never raises.
    """
    kind = _kind(path)
    if kind is None:
        raise ValueError(f"unsupported document type: {path.name!r} (supported: {SUPPORTED_SUFFIXES})")
    text = path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff")
    meta, text = split_front_matter(text, kind)
    return Document(build_sections(_READERS[kind](text), _stem(path, kind)), meta)


def read_sections(path: Path) -> list[Section]:
    return read_document(path).sections


def _kind(path: Path) -> str | None:
    return document_type(path.name)


def _stem(path: Path, kind: str) -> str:
    if kind == ".rst.txt":
        return path.name[: -len(kind)]
    return path.stem
