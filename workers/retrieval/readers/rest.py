"""reStructuredText, and plain text read as it (pydoc's topics and RFCs underline headings so).

Titles are over- or underlined; their depth is the order in which each adornment style first
appears. A top-level Python-domain description (``.. function:: os.chmod(...)``) is a section of
its own, under the heading it appears in, since the library reference is organised by them far
more than by headings.
"""

from __future__ import annotations

import re

from ragline.workers.retrieval.readers.roles import strip_roles
from ragline.workers.retrieval.readers.sections import (
    DESCRIPTION_LEVEL,
    Block,
    RawSection,
    code_block,
    prose_block,
    slug,
)

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
# Directives whose indented body is taken with them: reading goes on where it ends.
_BODY_DIRECTIVES = _MODULE_DIRECTIVES | _SKIP_DIRECTIVES | _CODE_DIRECTIVES


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


def is_underline(lines: list[str], i: int) -> bool:
    return i < len(lines) and _adornment_char(lines[i]) is not None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indented_end(lines: list[str], start: int, base: int) -> int:
    """The first line from ``start`` that is not blank and not indented past ``base``."""
    j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
        j += 1
    return j


def _rst_prose(lines: list[str]) -> Block:
    """A paragraph as it reads: roles and inline literals without their markup."""
    return prose_block([strip_roles(line).replace("``", "").replace(" --- ", " — ") for line in lines])


def _plain_title(title: str) -> str:
    """A title without reST roles and inline markup: ":keyword:`global`" → "global"."""
    plain = strip_roles(title).replace("``", "").replace("**", "")
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


def read_rest(text: str) -> list[RawSection]:
    lines = text.split("\n")
    parts = [RawSection(0, None, "", [])]
    styles: list[tuple[str, bool]] = []
    heading: RawSection | None = None  # the last heading, to go back to after a description
    heading_anchor = ""
    labels: list[str] = []
    para: list[str] = []
    module = ""

    def flush() -> None:
        if para:
            # A doctest paragraph is code.
            doctest = para[0].lstrip().startswith(">>>")
            parts[-1].blocks.append(code_block(para) if doctest else _rst_prose(para))
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
            heading = RawSection(styles.index(style), _plain_title(text_), anchor, [])
            # Made once: text after each description goes back under this heading with it.
            heading_anchor = anchor or slug(heading.title or "")
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
            if kind in _BODY_DIRECTIVES:
                # Only these look ahead for their body's end (the others' bodies are read as text),
                # so each line is looked ahead over once.
                end = _indented_end(lines, i + 1, indent)
                if kind in _MODULE_DIRECTIVES:
                    module = argument
                elif kind in _CODE_DIRECTIVES and (body := _dedent(lines[i + 1 : end])):
                    parts[-1].blocks.append(code_block(body))
                i = end
                continue
            if kind.removeprefix("py:") in _DESCRIPTIONS and indent == 0:
                name = _description_name(kind.removeprefix("py:"), argument, module)
                anchor = labels[0] if labels else name
                parts.append(RawSection(DESCRIPTION_LEVEL, name, anchor, [Block(f"{kind}:: {argument}")]))
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
        if heading is not None and parts[-1].level == DESCRIPTION_LEVEL and _indent(line) == 0:
            # Text at column 0 after a description belongs to the heading above it again.
            flush()
            parts.append(RawSection(heading.level, heading.title, heading_anchor, []))
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
                parts[-1].blocks.append(code_block(_dedent(body)))
            i = end
    flush()
    return parts


def read_plain_text(text: str) -> list[RawSection]:
    # Plain text often underlines its headings as reST does (pydoc's topics, RFCs): read them so.
    return read_rest(text)


def _dedent(lines: list[str]) -> list[str]:
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    lines = lines[start:]
    width = min((_indent(line) for line in lines if line.strip()), default=0)
    return [line[width:] for line in lines]
