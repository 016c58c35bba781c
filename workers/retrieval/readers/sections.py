"""What every reader makes: a document's titled sections of blocks, and the parts they are built of.

A section is what one heading covers, with the path of headings above it ("Simple statements",
"The global statement") and the anchor a browser would jump to. Its text is a list of blocks:
prose paragraphs and code blocks, so that the chunker can keep a code block whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TITLE_SEPARATOR = " › "
# Deeper than any heading: the next heading, or the next description, ends it.
DESCRIPTION_LEVEL = 1000


@dataclass(frozen=True, slots=True)
class Block:
    text: str
    code: bool = False


@dataclass(frozen=True, slots=True)
class Section:
    title_path: tuple[str, ...]
    anchor: str
    blocks: tuple[Block, ...]
    # A reST description (``.. function::`` …) rather than a heading's section.
    description: bool = False

    @property
    def title(self) -> str:
        """The section's own heading."""
        return self.title_path[-1]

    @property
    def path_title(self) -> str:
        """Every heading above it and its own: "Simple statements › The global statement"."""
        return TITLE_SEPARATOR.join(self.title_path)

    @property
    def text(self) -> str:
        return "\n\n".join(b.text for b in self.blocks)


@dataclass(frozen=True, slots=True)
class Document:
    sections: list[Section]
    # Front matter (Markdown ``---`` … ``---`` or a reStructuredText field list at the top).
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RawSection:
    """A heading (None before the first one) at a depth, its anchor, and the blocks under it."""

    level: int
    title: str | None
    anchor: str
    blocks: list[Block]
    # Text before the first heading titled by the document itself (HTML's <title>): no heading
    # that follows nests under it.
    standalone: bool = False


def build_sections(raw: list[RawSection], stem: str) -> list[Section]:
    """Sections with their title paths, in document order; those without text dropped."""
    sections: list[Section] = []
    open_: list[tuple[int, str]] = []  # the headings above, with their depths
    for part in raw:
        if part.standalone:
            path: tuple[str, ...] = (part.title or stem,)
        elif part.title is not None:
            while open_ and open_[-1][0] >= part.level:
                open_.pop()
            open_.append((part.level, part.title))
            path = tuple(t for _, t in open_)
        else:
            path = tuple(t for _, t in open_) or (stem,)
        blocks = tuple(b for b in part.blocks if b.text.strip())
        if blocks:
            description = part.level == DESCRIPTION_LEVEL
            sections.append(Section(path, part.anchor or slug(path[-1]), blocks, description))
    return sections


def slug(title: str) -> str:
    """An anchor made from a heading as Sphinx and GitHub make one: lower case, runs of anything
    but letters and digits as one hyphen."""
    return re.sub(r"[^\w]+|_+", "-", title.lower()).strip("-")


def prose_block(lines: list[str]) -> Block:
    # Source line breaks inside a paragraph are only wrapping.
    return Block(" ".join(" ".join(lines).split()))


def code_block(lines: list[str]) -> Block:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return Block("\n".join(line.rstrip() for line in lines[:end]), code=True)


def collapse(text: str) -> str:
    return " ".join(text.split())
