"""Read .txt, .md, .rst and .html documents into titled sections of blocks (stdlib parsers).

A section is what one heading covers, with the path of headings above it ("Simple statements",
"The global statement") and the anchor a browser would jump to. Its text is a list of blocks:
prose paragraphs and code blocks, so that the chunker can keep a code block whole. In
reStructuredText a top-level Python-domain description (``.. function:: os.chmod(...)``) is a
section of its own, under the heading it appears in, since the library reference is organised by
them far more than by headings.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from broker.contract import DOCUMENT_SUFFIXES

TITLE_SEPARATOR = " › "


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


SUPPORTED_SUFFIXES: tuple[str, ...] = DOCUMENT_SUFFIXES


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
    meta, text = _front_matter(text, kind)
    return Document(_sections(_READERS[kind](text), _stem(path, kind)), meta)


def read_sections(path: Path) -> list[Section]:
    return read_document(path).sections


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


@dataclass(slots=True)
class _Raw:
    """A heading (None before the first one) at a depth, its anchor, and the blocks under it."""

    level: int
    title: str | None
    anchor: str
    blocks: list[Block]
    # Text before the first heading titled by the document itself (HTML's <title>): no heading
    # that follows nests under it.
    standalone: bool = False


def _sections(raw: list[_Raw], stem: str) -> list[Section]:
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
            description = part.level == _DESCRIPTION_LEVEL
            sections.append(Section(path, part.anchor or slug(path[-1]), blocks, description))
    return sections


def slug(title: str) -> str:
    """An anchor made from a heading as Sphinx and GitHub make one: lower case, runs of anything
    but letters and digits as one hyphen."""
    return re.sub(r"[^\w]+|_+", "-", title.lower()).strip("-")


def _prose(lines: list[str]) -> Block:
    # Source line breaks inside a paragraph are only wrapping.
    return Block(" ".join(" ".join(lines).split()))


def _code(lines: list[str]) -> Block:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return Block("\n".join(line.rstrip() for line in lines), code=True)


# --- front matter -----------------------------------------------------------------------------------

_FIELD = re.compile(r"^:([\w-]+):\s*(.*)$")
_MD_FIELD = re.compile(r"^([\w-]+)\s*:\s*(.*?)\s*$")


def _front_matter(text: str, kind: str) -> tuple[dict[str, str], str]:
    """Simple ``key: value`` front matter, removed from the text (nested YAML is not read)."""
    meta: dict[str, str] = {}
    if kind == ".md" and text.startswith("---\n"):
        end = text.find("\n---", 3)
        if end > 0:
            for line in text[4:end].split("\n"):
                m = _MD_FIELD.match(line)
                if m and m.group(2):
                    meta[m.group(1).lower()] = m.group(2).strip("\"'")
            return meta, text[end + 4 :].removeprefix("\n")
    if kind in (".rst", ".rst.txt"):
        lines = text.split("\n")
        i = 0
        # A field list at the very top, ended by a blank line (a title with a role, ":mod:`os`"
        # over its underline, is not one).
        while i < len(lines) and (m := _FIELD.match(lines[i])) and not _is_underline(lines, i + 1):
            meta[m.group(1).lower()] = m.group(2).strip()
            i += 1
        if i < len(lines) and lines[i].strip():
            return {}, text
        return meta, "\n".join(lines[i:])
    return meta, text


# --- plain text -------------------------------------------------------------------------------------


def _read_txt(text: str) -> list[_Raw]:
    # Plain text often underlines its headings as reST does (pydoc's topics, RFCs): read them so.
    return _read_rst(text)


# --- Markdown ---------------------------------------------------------------------------------------

# CommonMark: up to three spaces of indent (four would be a code block), and the #s must be followed
# by whitespace or the end of the line, so "#hashtag" is not a heading.
_MD_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _read_md(text: str) -> list[_Raw]:
    parts = [_Raw(0, None, "", [])]
    para: list[str] = []
    code: list[str] = []
    fence: str | None = None

    def flush_para() -> None:
        if para:
            # A paragraph indented by four spaces is an indented code block.
            is_code = all(line.startswith("    ") or not line.strip() for line in para)
            parts[-1].blocks.append(_code(para) if is_code else _prose(para))
            para.clear()

    for line in text.split("\n"):
        if fence is not None:
            code.append(line)
            # A fence closes only on a bare run of the same char at least as long as the opener.
            stripped = line.strip()
            if stripped.startswith(fence) and stripped == stripped[0] * len(stripped):
                fence = None
                parts[-1].blocks.append(_code(code))
                code = []
            continue
        opener = _MD_FENCE.match(line)
        if opener:
            flush_para()
            fence, code = opener.group(1), [line]
            continue
        heading = _MD_HEADING.match(line)
        if heading:
            flush_para()
            title = (heading.group(2) or "").strip()
            parts.append(_Raw(len(heading.group(1)), title or None, "", []))
            continue
        if line.strip():
            para.append(line)
        else:
            flush_para()
    if fence is not None:
        parts[-1].blocks.append(_code(code))
    flush_para()
    return parts


# --- reStructuredText ---------------------------------------------------------------------------------

_RST_ADORNMENT_CHARS = "=-~^\"'*+#:.`_"
_LABEL = re.compile(r"^\.\. _([^:]+):\s*$")
_DIRECTIVE = re.compile(r"^(\s*)\.\. ([\w:-]+)::(.*)$")
# Directives whose body is code, kept whole.
_CODE_DIRECTIVES = frozenset(
    {"code-block", "sourcecode", "code", "doctest", "testcode", "testoutput", "productionlist"}
)
# Directives that carry no text a reader wants (index entries, tables of contents, markup hints).
_SKIP_DIRECTIVES = frozenset(
    {
        "index",
        "toctree",
        "contents",
        "highlight",
        "sectionauthor",
        "moduleauthor",
        "tabularcolumns",
        "raw",
        "only",
        "include",
        "literalinclude",
        "image",
        "figure",
        "csv-table",
        "audit-event",
        "audit-event-table",
    }
)
# Version notes read as Sphinx renders them.
_VERSION_NOTES = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}.",
    "deprecated": "Deprecated since version {}.",
    "deprecated-removed": "Deprecated since version {}.",
}
# Python- and C-domain descriptions: each top-level one is a section of its own.
_DESCRIPTIONS = frozenset(
    {
        "function",
        "class",
        "method",
        "classmethod",
        "staticmethod",
        "abstractmethod",
        "attribute",
        "data",
        "exception",
        "decorator",
        "decoratormethod",
        "coroutinefunction",
        "coroutinemethod",
        "property",
        "opcode",
        "option",
        "cmdoption",
        "envvar",
        "describe",
        "pdbcommand",
        "c:function",
        "c:type",
        "c:macro",
        "c:member",
        "c:var",
    }
)
_MODULE_DIRECTIVES = frozenset({"module", "currentmodule", "py:module", "py:currentmodule"})
# Deeper than any heading: the next heading, or the next description, ends it.
_DESCRIPTION_LEVEL = 1000


def _adornment_char(line: str) -> str | None:
    """The repeated punctuation char if ``line`` is an adornment line (column 0, >= 3 chars)."""
    line = line.rstrip()
    if len(line) < 3 or line[0] not in _RST_ADORNMENT_CHARS or line != line[0] * len(line):
        return None
    return line[0]


def _rst_title(lines: list[str], i: int) -> tuple[str, tuple[str, bool], int] | None:
    """The title starting at line ``i`` (its text, its adornment style, the lines it takes)."""
    n = len(lines)
    # Titles must start a text block; this keeps a paragraph's last line above a rule from being
    # mistaken for a title.
    if i > 0 and lines[i - 1].strip():
        return None
    over = _adornment_char(lines[i])
    if over is not None and i + 2 < n:
        candidate = lines[i + 1].strip()
        if (
            candidate
            and _adornment_char(lines[i + 1]) is None
            and _adornment_char(lines[i + 2]) == over
            and len(lines[i].rstrip()) >= len(candidate)
            and len(lines[i + 2].rstrip()) >= len(candidate)
        ):
            return candidate, (over, True), 3
    if i + 1 < n:
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
            return line.strip(), (under, False), 2
    return None


def _is_underline(lines: list[str], i: int) -> bool:
    return i < len(lines) and _adornment_char(lines[i]) is not None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indented_end(lines: list[str], start: int, base: int) -> int:
    """The first line from ``start`` that is not blank and not indented past ``base``."""
    j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
        j += 1
    return j


_ROLE = re.compile(r":[\w:+-]+:`~?!?([^`<]*?)(?:\s*<[^`]*>)?`")


def _rst_prose(lines: list[str]) -> Block:
    """A paragraph as it reads: roles and inline literals without their markup."""
    return _prose([_ROLE.sub(r"\1", line).replace("``", "").replace(" --- ", " — ") for line in lines])


def _plain_title(title: str) -> str:
    """A title without reST roles and inline markup: ":keyword:`global`" → "global"."""
    plain = _ROLE.sub(r"\1", title).replace("``", "").replace("**", "")
    return plain.replace(" --- ", " — ").strip()


def _description_name(kind: str, signature: str, module: str) -> str:
    """What a description is called, as Sphinx names its anchor: ``os.chmod``, ``PyList_New``."""
    if kind.startswith("c:"):
        head = signature.split("(")[0].split()
        return head[-1].lstrip("*") if head else signature
    name = re.split(r"[\s(\[]", signature.strip(), maxsplit=1)[0]
    if kind in ("option", "cmdoption", "envvar", "describe", "opcode", "pdbcommand"):
        return name
    if module and not name.startswith(module + "."):
        return f"{module}.{name}"
    return name


def _read_rst(text: str) -> list[_Raw]:
    lines = text.split("\n")
    parts = [_Raw(0, None, "", [])]
    styles: list[tuple[str, bool]] = []
    heading: _Raw | None = None  # the last heading, to go back to after a description
    labels: list[str] = []
    para: list[str] = []
    module = ""

    def flush() -> None:
        if para:
            # A doctest paragraph is code.
            parts[-1].blocks.append(_code(para) if para[0].lstrip().startswith(">>>") else _rst_prose(para))
            para.clear()

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            flush()
            i += 1
            continue
        title = _rst_title(lines, i)
        if title is not None:
            flush()
            text_, style, taken = title
            if style not in styles:
                styles.append(style)
            anchor = labels[0] if labels else ""
            heading = _Raw(styles.index(style), _plain_title(text_), anchor, [])
            parts.append(heading)
            labels = []
            i += taken
            continue
        label = _LABEL.match(line)
        if label:
            flush()
            labels.append(label.group(1).strip())
            i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            flush()
            indent, kind, argument = len(directive.group(1)), directive.group(2), directive.group(3).strip()
            end = _indented_end(lines, i + 1, indent)
            if kind in _MODULE_DIRECTIVES:
                module = argument
                i = end
                continue
            if kind in _SKIP_DIRECTIVES:
                i = end
                continue
            if kind in _CODE_DIRECTIVES:
                body = _dedent(lines[i + 1 : end])
                if body:
                    parts[-1].blocks.append(_code(body))
                i = end
                continue
            if kind.removeprefix("py:") in _DESCRIPTIONS and indent == 0:
                name = _description_name(kind.removeprefix("py:"), argument, module)
                anchor = labels[0] if labels else name
                parts.append(_Raw(_DESCRIPTION_LEVEL, name, anchor, [Block(f"{kind}:: {argument}")]))
                labels = []
                i += 1
                continue
            if kind in _VERSION_NOTES and argument:
                parts[-1].blocks.append(Block(_VERSION_NOTES[kind].format(argument.split()[0])))
            elif argument:
                # A directive's own line reads as prose ("note::" carries nothing, an argument does).
                parts[-1].blocks.append(_rst_prose([argument]))
            i += 1
            continue
        labels = []
        if heading is not None and parts[-1].level == _DESCRIPTION_LEVEL and _indent(line) == 0:
            # Text at column 0 after a description belongs to the heading above it again.
            flush()
            parts.append(_Raw(heading.level, heading.title, heading.anchor or slug(heading.title or ""), []))
        para.append(line)
        i += 1
        stripped = line.rstrip()
        if stripped.endswith("::"):
            # A literal block follows: every line indented past the paragraph's, kept whole.
            end = _indented_end(lines, i, _indent(para[0]))
            flush_text = " ".join(para).rstrip()[:-1]  # "Example::" reads "Example:"
            para.clear()
            if flush_text.strip(": "):
                parts[-1].blocks.append(_rst_prose([flush_text]))
            body = lines[i:end]
            if any(b.strip() for b in body):
                parts[-1].blocks.append(_code(_dedent(body)))
            i = end
    flush()
    return parts


def _dedent(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    width = min((_indent(line) for line in lines if line.strip()), default=0)
    return [line[width:] for line in lines]


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
_PERMALINK = "¶"


class _SectionParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[_Raw] = [_Raw(0, None, "", [])]
        self.doc_title = ""
        self._text: list[str] = []
        self._code: list[str] | None = None
        self._heading: list[str] | None = None
        self._heading_level = 0
        self._heading_id = ""
        self._last_id = ""  # the latest element id before a heading: Sphinx puts it on <section>
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
        element_id = dict(attrs).get("id") or ""
        if tag in _HEADING_TAGS:
            self._end_heading()
            self._flush_text()
            self._heading, self._heading_level = [], int(tag[1])
            self._heading_id = element_id or self._last_id
            return
        if element_id and self._heading is None:
            self._last_id = element_id
        if tag in _BLOCK_TAGS and tag != "br" and self._heading and "".join(self._heading).strip():
            # A block after heading text most likely means the heading's end tag was missing; ending
            # the heading here stops it from swallowing the rest of the document.
            self._end_heading()
        if tag == "pre":
            self._pre += 1
            if self._pre == 1 and self._heading is None:
                self._flush_text()
                self._code = []
            return
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
            if self._pre == 0:
                self._flush_code()
            return
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
        if self._code is not None:
            self._code.append(data)
            return
        # Outside <pre> source newlines are just whitespace.
        self._emit(data.replace("\n", " "))

    def _emit(self, text: str) -> None:
        if self._heading is not None:
            self._heading.append(" " if text == "\n" else text)
        elif self._code is not None:
            self._code.append(text)
        else:
            self._text.append(text)

    def _flush_text(self) -> None:
        lines = (_collapse(line) for line in "".join(self._text).split("\n"))
        self.parts[-1].blocks.extend(Block(line) for line in lines if line)
        self._text = []

    def _flush_code(self) -> None:
        if self._code is not None:
            self.parts[-1].blocks.append(_code("".join(self._code).strip("\n").split("\n")))
            self._code = None

    def _end_heading(self) -> None:
        # Also called for a heading left unclosed: its text still names what follows it.
        if self._heading is not None:
            title = _collapse("".join(self._heading).replace(_PERMALINK, ""))
            self.parts.append(_Raw(self._heading_level, title or None, self._heading_id, []))
            self._heading = None
            self._last_id = ""

    def finish(self) -> list[_Raw]:
        self._end_heading()
        self._flush_code()
        self._flush_text()
        if self.parts[0].blocks and (title := _collapse(self.doc_title)):
            # Text before the first heading is titled by the document's <title>.
            self.parts[0] = _Raw(0, title, "", self.parts[0].blocks, standalone=True)
        return self.parts


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _read_html(text: str) -> list[_Raw]:
    parser = _SectionParser()
    # html.parser's declaration scanner asserts on some malformed "<!" markup; keep what was parsed.
    with contextlib.suppress(AssertionError):
        parser.feed(text)
        parser.close()
    return parser.finish()


_READERS: dict[str, Callable[[str], list[_Raw]]] = {
    ".txt": _read_txt,
    ".md": _read_md,
    ".rst": _read_rst,
    ".rst.txt": _read_rst,
    ".html": _read_html,
    ".htm": _read_html,
}
