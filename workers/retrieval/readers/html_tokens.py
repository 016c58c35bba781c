"""HTML as a stream of start tags, end tags and text, in one pass: what the HTML reader needs.

The standard library's ``html.parser`` searched to the end of the document again at each
construct left open (on Python 3.11.7: quadratic in a run of ``<!--``, ``</``, ``<a b='``), and
how it copes with one changes between patch releases. This tokenizer reads well-formed HTML as
``html.parser`` does: tag and attribute names lower-cased, attribute values and text with
character references replaced, the text of <script> and <style> raw up to their end tag,
comments, declarations and processing instructions skipped. Where markup is left open it does
what the HTML standard does, with no search repeated: a comment, declaration or instruction
without its end runs to the end of the document, and so does a <script> or <style> without its
end tag; a start tag without a ">" makes the rest of the document text; a quoted attribute value
whose quote never closes is read as a bare value.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from html import unescape


@dataclass(frozen=True, slots=True)
class StartTag:
    name: str
    attrs: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True, slots=True)
class EndTag:
    name: str


@dataclass(frozen=True, slots=True)
class Text:
    text: str


Token = StartTag | EndTag | Text

# html.parser's patterns for the parts of a tag, each a single run, so that matching one never
# backtracks further than its own run.
_TAG_NAME_REST = re.compile(r"[^\t\n\r\f />\x00]*")
_BETWEEN_ATTRIBUTES = re.compile(r"(?:\s|/(?!>))*")
# The first character is whatever stopped the run between attributes, even "=" or a quote.
_ATTRIBUTE_NAME = re.compile(r".[^\s/=>]*", re.DOTALL)
_EQUALS = re.compile(r"\s*=+\s*")
_BARE_VALUE = re.compile(r"[^>\s]*")
_END_TAG_NAME = re.compile(r"[a-zA-Z][-.a-zA-Z0-9:_]*")
_COMMENT_END = re.compile(r"--\s*>")
_RAW_TEXT_END = {name: re.compile(rf"</\s*{name}\s*>", re.IGNORECASE) for name in ("script", "style")}


def tokens(html: str) -> Iterator[Token]:
    """The tokens of ``html`` in order; text comes in pieces (split at each "<")."""
    return _Tokenizer(html).tokens()


def _end(pattern: re.Pattern[str], html: str, at: int) -> int:
    """Where the run of ``pattern`` (one that matches the empty string) from ``at`` ends."""
    match = pattern.match(html, at)
    return at if match is None else match.end()


class _Tokenizer:
    def __init__(self, html: str) -> None:
        self.html = html
        # Where each quote and ">" last occurs: past it, a quoted value or a tag cannot end, which
        # is known at once instead of by a search to the end of the document each time.
        self.last_quote = {quote: html.rfind(quote) for quote in "'\""}
        self.last_gt = html.rfind(">")

    def tokens(self) -> Iterator[Token]:
        html, n = self.html, len(self.html)
        i = 0
        while i < n:
            lt = html.find("<", i)
            if lt < 0:
                lt = n
            if lt > i:
                yield Text(unescape(html[i:lt]))
            i = lt
            if i == n:
                return
            after = html[i + 1 : i + 2]
            if after.isascii() and after.isalpha():
                found = self._start_tag(i)
                if found is None:
                    yield Text(unescape(html[i:]))
                    return
                tag, closed, i = found
                yield tag
                if closed:
                    yield EndTag(tag.name)
                elif tag.name in _RAW_TEXT_END:
                    end = _RAW_TEXT_END[tag.name].search(html, i)
                    if end is None:
                        return
                    if end.start() > i:
                        yield Text(html[i : end.start()])
                    yield EndTag(tag.name)
                    i = end.end()
            elif after == "/":
                i = yield from self._end_tag(i)
            elif html.startswith("<!--", i):
                comment_end = _COMMENT_END.search(html, i + 4)
                i = n if comment_end is None else comment_end.end()
            elif after in ("!", "?"):
                # <!DOCTYPE …>, a marked section, a processing instruction: up to the next ">".
                i = n if i + 2 > self.last_gt else html.find(">", i + 2) + 1
            else:
                yield Text("<")
                i += 1

    def _start_tag(self, i: int) -> tuple[StartTag, bool, int] | None:
        """The start tag at ``i`` ("<" and a letter), whether it closes itself ("<br/>"), and where
        it ends; None when no ">" ends it."""
        html, n = self.html, len(self.html)
        k = _end(_TAG_NAME_REST, html, i + 2)
        name = html[i + 1 : k].lower()
        attrs: list[tuple[str, str | None]] = []
        while True:
            k = _end(_BETWEEN_ATTRIBUTES, html, k)
            if k >= n:
                return None
            if html[k] == ">":
                return StartTag(name, tuple(attrs)), False, k + 1
            if html.startswith("/>", k):
                return StartTag(name, tuple(attrs)), True, k + 2
            name_end = _end(_ATTRIBUTE_NAME, html, k)
            attribute = html[k:name_end].lower()
            k = _end(_EQUALS, html, name_end)
            if k == name_end:
                attrs.append((attribute, None))
                continue
            quote = html[k : k + 1]
            if quote in ("'", '"') and k < self.last_quote[quote]:
                close = html.find(quote, k + 1)
                value, k = html[k + 1 : close], close + 1
            else:
                value_end = _end(_BARE_VALUE, html, k)
                value, k = html[k:value_end], value_end
            attrs.append((attribute, unescape(value)))

    def _end_tag(self, i: int) -> Generator[Token, None, int]:
        """The end tag at ``i`` ("</"), if it names one; returns where it ends."""
        html = self.html
        if i + 2 > self.last_gt:
            # Nothing ends it: text up to the next "<", as html.parser reads it.
            lt = html.find("<", i + 1)
            end = len(html) if lt < 0 else lt
            yield Text(unescape(html[i:end]))
            return end
        gt = html.find(">", i + 2)
        inside = html[i + 2 : gt]
        if _END_TAG_NAME.fullmatch(name := inside.strip()):
            yield EndTag(name.lower())
        elif inside[:1].isascii() and inside[:1].isalpha():
            # "</p class=x>": the name, and whatever follows it up to ">" ignored.
            yield EndTag(inside[: _end(_TAG_NAME_REST, inside, 1)].lower())
        # Otherwise "</>" or a bogus comment ("</ 3>"): skipped.
        return gt + 1
