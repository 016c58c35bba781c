"""The HTML tokenizer: well-formed HTML reads as html.parser reads it; what is left open, in one pass."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.workers.retrieval.readers.html_tokens import EndTag, StartTag, Text, Token, tokens

Event = tuple[str, ...] | tuple[str, str, tuple[tuple[str, str | None], ...]]


def _merged(events: list[Event]) -> list[Event]:
    """Adjacent text as one piece: where text is split is no part of what it says."""
    merged: list[Event] = []
    for event in events:
        if event[0] == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", str(merged[-1][1]) + str(event[1]))
        elif event != ("text", ""):
            merged.append(event)
    return merged


def _ours(html: str) -> list[Event]:
    def event(token: Token) -> Event:
        if isinstance(token, StartTag):
            return ("start", token.name, token.attrs)
        if isinstance(token, EndTag):
            return ("end", token.name)
        return ("text", token.text)

    return _merged([event(t) for t in tokens(html)])


class _Recorder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.events: list[Event] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.events.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.events.append(("end", tag))

    def handle_data(self, data: str) -> None:
        self.events.append(("text", data))


def _stdlib(html: str) -> list[Event]:
    recorder = _Recorder()
    recorder.feed(html)
    recorder.close()
    return _merged(recorder.events)


# --- well-formed HTML, as pages are written -----------------------------------------------------------

_TAGS = ["p", "div", "h1", "h2", "span", "a", "pre", "title", "head", "body", "td", "nav", "DIV", "x-note"]
_WORDS = ["word", " ", "\n", "\t", "&amp;", "&lt;", "&#169;", "&#x41;", "&copy", "& ", "> ", "< 3", "é", "¶"]
_text = st.lists(st.sampled_from(_WORDS), max_size=6).map("".join)
_attr_name = st.from_regex(r"[a-zA-Z_:][-a-zA-Z0-9_:.]{0,5}", fullmatch=True)
_attr_value = st.one_of(
    st.text(st.characters(exclude_characters="'"), max_size=8).map(lambda v: f"'{v}'"),
    st.text(st.characters(exclude_characters='"'), max_size=8).map(lambda v: f'"{v}"'),
    st.from_regex(r"[a-zA-Z0-9&;#./-]{0,6}", fullmatch=True),
)
_attribute = st.tuples(_attr_name, st.none() | _attr_value, st.sampled_from([" ", "  ", "\n", " / "])).map(
    lambda a: f"{a[2]}{a[0]}" if a[1] is None else f"{a[2]}{a[0]}={a[1]}"
)
_start = st.tuples(
    st.sampled_from(_TAGS), st.lists(_attribute, max_size=3), st.sampled_from([">", " >", "/>", " />"])
)
_raw_text = st.text(st.characters(exclude_characters="<"), max_size=10)
_piece = st.one_of(
    _text,
    _start.map(lambda t: f"<{t[0]}{''.join(t[1])}{t[2]}"),
    st.tuples(st.sampled_from(_TAGS), st.sampled_from(["", " ", "\n"])).map(lambda t: f"</{t[0]}{t[1]}>"),
    st.text(st.characters(exclude_characters="-"), max_size=10).map(lambda c: f"<!--{c}-->"),
    st.just("<!DOCTYPE html>"),
    st.just("<?xml version='1.0'?>"),
    st.tuples(st.sampled_from(["script", "style", "SCRIPT"]), _raw_text).map(
        lambda t: f"<{t[0]}>{t[1]}</{t[0]}>"
    ),
)


@settings(max_examples=400, deadline=None, database=None)
@given(st.lists(_piece, max_size=12).map("".join))
def test_well_formed_html_reads_as_html_parser_reads_it(html: str) -> None:
    assert _ours(html) == _stdlib(html)


def test_tags_attributes_and_text() -> None:
    html = "<!DOCTYPE html><P Class=\"a &amp; b\" id='x' hidden>Fish &amp; chips<BR/></p><!-- note -->"
    assert list(tokens(html)) == [
        StartTag("p", (("class", "a & b"), ("id", "x"), ("hidden", None))),
        Text("Fish & chips"),
        StartTag("br", ()),
        EndTag("br"),
        EndTag("p"),
    ]


def test_script_text_is_raw_up_to_its_end_tag() -> None:
    assert list(tokens("<script>if (a < b && c) {}</SCRIPT >after")) == [
        StartTag("script", ()),
        Text("if (a < b && c) {}"),
        EndTag("script"),
        Text("after"),
    ]


# --- what is left open: no search is repeated, and reading goes on where the standard says --------


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        # A comment, declaration or instruction without its end runs to the end of the document.
        ("a<!-- open <p>b", [Text("a")]),
        ("a<!DOCTYPE html", [Text("a")]),
        ("a<?php echo", [Text("a")]),
        # So does a <script> without its end tag.
        ("<script>x<p>b", [StartTag("script", ())]),
        # A start tag that no ">" ends makes the rest text.
        ("a<p class=x", [Text("a"), Text("<p class=x")]),
        # A quote that never closes opens no quoted value: the value is bare.
        ("<a title='x>text", [StartTag("a", (("title", "'x"),)), Text("text")]),
        # An end tag that no ">" ends is text up to the next "<".
        ("a</p <b", [Text("a"), Text("</p "), Text("<b")]),
        ("< 3", [Text("<"), Text(" 3")]),
    ],
)
def test_constructs_left_open(html: str, expected: list[Token]) -> None:
    assert list(tokens(html)) == expected
