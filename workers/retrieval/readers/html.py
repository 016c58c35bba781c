"""HTML: headings (h1-h6) make sections, <title> names the text before the first one, <pre> is code.

Read from the tokens of html_tokens, a tokenizer of our own that takes time linear in the document.
"""

from __future__ import annotations

from ragline.workers.retrieval.readers.html_tokens import EndTag, StartTag, Text, tokens
from ragline.workers.retrieval.readers.sections import Block, RawSection, code_block, collapse

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


class _Sections:
    """The sections of an HTML document, told its tokens in order."""

    def __init__(self) -> None:
        self.parts: list[RawSection] = [RawSection(0, None, "", [])]
        self._doc_title: list[str] = []
        self._text: list[str] = []
        self._code: list[str] | None = None
        self._heading: list[str] | None = None
        # Whether the open heading has text yet: kept as it grows, not joined again at each tag.
        self._heading_has_text = False
        self._heading_level = 0
        self._heading_id = ""
        self._last_id = ""  # the latest element id before a heading: Sphinx puts it on <section>
        self._skip = 0
        self._in_head = True
        self._in_title = False
        self._pre = 0

    def start_tag(self, tag: str, attrs: tuple[tuple[str, str | None], ...]) -> None:
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
            self._heading, self._heading_level, self._heading_has_text = [], int(tag[1]), False
            self._heading_id = element_id or self._last_id
            return
        if element_id and self._heading is None:
            self._last_id = element_id
        if tag in _BLOCK_TAGS and tag != "br" and self._heading_has_text:
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

    def end_tag(self, tag: str) -> None:
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

    def data(self, data: str) -> None:
        if self._skip:
            return
        if self._in_title:
            self._doc_title.append(data)
            return
        if self._in_head:
            if not data.strip():
                return
            self._in_head = False
        if self._heading is not None:
            self._add_to_heading(self._heading, data)
            return
        if self._code is not None:
            self._code.append(data)
            return
        # Outside <pre> source newlines are just whitespace.
        self._emit(data.replace("\n", " "))

    def _emit(self, text: str) -> None:
        if self._heading is not None:
            self._add_to_heading(self._heading, " " if text == "\n" else text)
        elif self._code is not None:
            self._code.append(text)
        else:
            self._text.append(text)

    def _add_to_heading(self, heading: list[str], text: str) -> None:
        heading.append(text)
        self._heading_has_text = self._heading_has_text or bool(text.strip())

    def _flush_text(self) -> None:
        lines = (collapse(line) for line in "".join(self._text).split("\n"))
        self.parts[-1].blocks.extend(Block(line) for line in lines if line)
        self._text = []

    def _flush_code(self) -> None:
        if self._code is not None:
            self.parts[-1].blocks.append(code_block("".join(self._code).strip("\n").split("\n")))
            self._code = None

    def _end_heading(self) -> None:
        # Also called for a heading left unclosed: its text still names what follows it.
        if self._heading is not None:
            title = collapse("".join(self._heading).replace(_PERMALINK, ""))
            self.parts.append(RawSection(self._heading_level, title or None, self._heading_id, []))
            self._heading = None
            self._last_id = ""

    def finish(self) -> list[RawSection]:
        self._end_heading()
        self._flush_code()
        self._flush_text()
        if self.parts[0].blocks and (title := collapse("".join(self._doc_title))):
            # Text before the first heading is titled by the document's <title>.
            self.parts[0] = RawSection(0, title, "", self.parts[0].blocks, standalone=True)
        return self.parts


def read_html(text: str) -> list[RawSection]:
    sections = _Sections()
    for token in tokens(text):
        if isinstance(token, StartTag):
            sections.start_tag(token.name, token.attrs)
        elif isinstance(token, EndTag):
            sections.end_tag(token.name)
        elif isinstance(token, Text):
            sections.data(token.text)
    return sections.finish()
