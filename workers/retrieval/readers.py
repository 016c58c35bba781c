"""Read .txt, .md, .rst and .html documents into titled sections (stdlib only)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    text: str


SUPPORTED_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".rst", ".rst.txt", ".html", ".htm")


def is_supported(path: Path) -> bool:
    """Whether ``read_sections`` can read ``path`` (by its lowercased name ending)."""
    return _kind(path) is not None


def read_sections(path: Path) -> list[Section]:
    """Read ``path`` into sections in document order, dropping sections without text.

    Raises ``ValueError`` for an unsupported suffix and ``OSError`` if the file cannot be
    read; malformed content never raises.
    """
    kind = _kind(path)
    if kind is None:
        raise ValueError(f"unsupported document type: {path.name!r} (supported: {SUPPORTED_SUFFIXES})")
    text = path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff")
    stem = _stem(path, kind)
    raw = _READERS[kind](text, stem)
    return [Section(title, body.strip()) for title, body in raw if body.strip()]


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    # Longest suffix first, so ".rst.txt" is not taken for plain text.
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return None


def _stem(path: Path, kind: str) -> str:
    if kind == ".rst.txt":
        return path.name[: -len(kind)]
    return path.stem


# --- plain text -------------------------------------------------------------------------------------


def _read_txt(text: str, stem: str) -> list[tuple[str, str]]:
    return [(stem, text)]


# --- Markdown ---------------------------------------------------------------------------------------

# CommonMark: up to three spaces of indent (four would be a code block), and the #s must be followed
# by whitespace or the end of the line, so "#hashtag" is not a heading.
_MD_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _read_md(text: str, stem: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, str]] = []
    title = stem
    lines: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        if fence is not None:
            # A fence closes only on a bare run of the same char at least as long as the opener.
            stripped = line.strip()
            if stripped.startswith(fence) and stripped == stripped[0] * len(stripped):
                fence = None
            lines.append(line)
            continue
        opener = _MD_FENCE.match(line)
        if opener:
            fence = opener.group(1)
            lines.append(line)
            continue
        heading = _MD_HEADING.match(line)
        if heading:
            sections.append((title, "\n".join(lines)))
            title, lines = (heading.group(2) or "").strip() or stem, []
            continue
        lines.append(line)
    sections.append((title, "\n".join(lines)))
    return sections


# --- reStructuredText ---------------------------------------------------------------------------------

_RST_ADORNMENT_CHARS = "=-~^\"'*+#:.`_"


def _adornment_char(line: str) -> str | None:
    """The repeated punctuation char if ``line`` is an adornment line (column 0, >= 3 chars)."""
    line = line.rstrip()
    if len(line) < 3 or line[0] not in _RST_ADORNMENT_CHARS or line != line[0] * len(line):
        return None
    return line[0]


def _read_rst(text: str, stem: str) -> list[tuple[str, str]]:
    lines = text.split("\n")
    sections: list[tuple[str, str]] = []
    title = stem
    body: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        # Titles must start a text block; this keeps a paragraph's last line above a rule from
        # being mistaken for a title.
        at_block_start = i == 0 or not lines[i - 1].strip()
        if at_block_start and i + 2 < n:
            over = _adornment_char(lines[i])
            candidate = lines[i + 1].strip()
            if (
                over is not None
                and candidate
                and _adornment_char(lines[i + 1]) is None
                and _adornment_char(lines[i + 2]) == over
                and len(lines[i].rstrip()) >= len(candidate)
                and len(lines[i + 2].rstrip()) >= len(candidate)
            ):
                sections.append((title, "\n".join(body)))
                title, body = candidate, []
                i += 3
                continue
        if at_block_start and i + 1 < n:
            line = lines[i]
            under = _adornment_char(lines[i + 1])
            # Underline-only titles cannot be indented (that would be a block quote), and a line that
            # is itself an adornment is an overline or a transition, not a title.
            if (
                under is not None
                and line.strip()
                and not line[0].isspace()
                and _adornment_char(line) is None
                and len(lines[i + 1].rstrip()) >= len(line.rstrip())
            ):
                sections.append((title, "\n".join(body)))
                title, body = line.strip(), []
                i += 2
                continue
        body.append(lines[i])
        i += 1
    sections.append((title, "\n".join(body)))
    return sections


# --- HTML ---------------------------------------------------------------------------------------------

_SKIP_TAGS = frozenset({"script", "style", "nav"})
_HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_BLOCK_TAGS = _HEADING_TAGS | {
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "header",
    "hr",
    "li",
    "main",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "tbody",
    "tfoot",
    "thead",
    "tr",
    "ul",
}
_CELL_TAGS = frozenset({"td", "th"})
# Like browsers, treat the document as in <head> until a non-head tag or visible text shows up, since
# </head>, <head> and <body> are all optional.
_PRE_BODY_TAGS = frozenset(
    {"base", "html", "link", "meta", "noscript", "script", "style", "template", "title"}
)


class _SectionParser(HTMLParser):
    def __init__(self, stem: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stem = stem
        self.sections: list[tuple[str, str]] = []
        self.doc_title = ""
        self._title: str | None = None  # None until the first heading: the doc title applies
        self._parts: list[str] = []
        self._heading: list[str] | None = None
        self._skip = 0
        self._in_head = True
        self._in_title = False
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <title> holds only text, so any tag means its end tag was missing.
        self._in_title = False
        if tag == "head":
            self._in_head = True
            return
        if self._in_head and (tag == "body" or tag not in _PRE_BODY_TAGS):
            self._in_head = False
        if tag in _SKIP_TAGS:
            self._skip += 1
            return
        if tag == "title" and self._in_head:
            self._in_title = True
            return
        if self._skip:
            return
        if tag in _HEADING_TAGS:
            self._end_heading()
            self._flush()
            self._heading = []
            return
        if tag in _BLOCK_TAGS and tag != "br" and self._heading and "".join(self._heading).strip():
            # A block after heading text most likely means the heading's end tag was missing; ending
            # the heading here stops it from swallowing the rest of the document.
            self._end_heading()
        if tag == "pre":
            self._pre += 1
        if tag in _BLOCK_TAGS:
            self._emit("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self._in_head = False
            return
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
            return
        if tag == "title" and self._in_title:
            self._in_title = False
            return
        if self._skip:
            return
        if tag in _HEADING_TAGS and self._heading is not None:
            self._end_heading()
            return
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK_TAGS:
            self._emit("\n")
        elif tag in _CELL_TAGS:
            self._emit(" ")

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._in_title:
            self.doc_title += data
            return
        if self._in_head:
            if not data.strip():
                return
            self._in_head = False
        if self._heading is not None:
            self._heading.append(data)
            return
        # Outside <pre> source newlines are just whitespace; inside they are the content's lines.
        self._emit(data if self._pre else data.replace("\n", " "))

    def _emit(self, text: str) -> None:
        if self._heading is not None:
            self._heading.append(" " if text == "\n" else text)
        else:
            self._parts.append(text)

    def _flush(self) -> None:
        lines = (_collapse(line) for line in "".join(self._parts).split("\n"))
        text = "\n".join(line for line in lines if line)
        title = self._title if self._title is not None else (_collapse(self.doc_title) or self.stem)
        self.sections.append((title, text))
        self._parts = []

    def _end_heading(self) -> None:
        # Also called for a heading left unclosed: its text still names what follows it.
        if self._heading is not None:
            self._title = _collapse("".join(self._heading)) or self.stem
            self._heading = None

    def finish(self) -> list[tuple[str, str]]:
        self._end_heading()
        self._flush()
        return self.sections


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _read_html(text: str, stem: str) -> list[tuple[str, str]]:
    parser = _SectionParser(stem)
    # html.parser's declaration scanner asserts on some malformed "<!" markup; keep what was parsed.
    with contextlib.suppress(AssertionError):
        parser.feed(text)
        parser.close()
    return parser.finish()


_READERS: dict[str, Callable[[str, str], list[tuple[str, str]]]] = {
    ".txt": _read_txt,
    ".md": _read_md,
    ".rst": _read_rst,
    ".rst.txt": _read_rst,
    ".html": _read_html,
    ".htm": _read_html,
}
