"""Read .txt, .md, .rst and .html documents into titled sections of blocks, one module per format.

``documents`` picks the reader by the file's name; ``front_matter`` takes the metadata off the top;
``markdown``, ``rest`` (reStructuredText and plain text, with ``roles``) and ``html`` (on
``html_tokens``) make the sections (``sections``). Every reader takes time linear in its input:
documents come from tenants with write keys.
"""

from ragline.workers.retrieval.readers.documents import (
    SUPPORTED_SUFFIXES,
    is_supported,
    read_document,
    read_sections,
)
from ragline.workers.retrieval.readers.sections import TITLE_SEPARATOR, Block, Document, Section, slug

__all__ = [
    "SUPPORTED_SUFFIXES",
    "TITLE_SEPARATOR",
    "Block",
    "Document",
    "Section",
    "is_supported",
    "read_document",
    "read_sections",
    "slug",
]
