"""HTML: headings, <title>, skipped elements, malformed markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.workers.retrieval.readers import Section, read_sections

# Shared with tests/workers/retrieval/test_chunking.py.
DATA = Path(__file__).parents[1] / "data"


def _pairs(path: Path) -> list[tuple[str, str]]:
    """Each section's own heading and text."""
    return [(s.title, s.text) for s in read_sections(path)]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_html_sections_skip_script_style_head_nav(tmp_path: Path) -> None:
    text = """<!DOCTYPE html>
<html>
<head>
  <title>The  Guide</title>
  <meta charset="utf-8">
  <style>body { color: red; }</style>
  <script>var x = "<h1>fake</h1>";</script>
</head>
<body>
  <nav><a href="/">Home</a> <h2>Nav heading</h2></nav>
  <p>Intro   text
     across lines.</p>
  <h1>First &amp; <em>Foremost</em></h1>
  <p>Para one.</p><p>Para two<br>after break.</p>
  <script>document.write("hidden")</script>
  <div>Div text</div>
  <h2>Lists</h2>
  <ul><li>one</li><li>two</li></ul>
  <table><tr><td>a</td><td>b</td></tr><tr><th>c</th></tr></table>
  <pre>line 1
line 2</pre>
  <h3></h3>
  <style>.x {}</style>
</body>
</html>
"""
    sections = read_sections(_write(tmp_path, "page.html", text))
    assert [(s.title, s.text) for s in sections] == [
        ("The Guide", "Intro text across lines."),
        ("First & Foremost", "Para one.\n\nPara two\n\nafter break.\n\nDiv text"),
        ("Lists", "one\n\ntwo\n\na b\n\nc\n\nline 1\nline 2"),
    ]
    joined = " ".join(s.title + " " + s.text for s in sections)
    for hidden in ("color", "fake", "hidden", "Home", "Nav heading"):
        assert hidden not in joined


def test_html_block_wrapped_heading_text(tmp_path: Path) -> None:
    path = _write(tmp_path, "w.html", "<h1><div>Wrapped</div> <span>Title</span></h1><p>body</p>")
    assert _pairs(path) == [("Wrapped Title", "body")]


def test_html_without_head_or_title_uses_stem(tmp_path: Path) -> None:
    sections = _pairs(_write(tmp_path, "bare.htm", "plain <b>bold</b> text<h2>H</h2>more"))
    assert sections == [("bare", "plain bold text"), ("H", "more")]


@pytest.mark.parametrize(
    "text",
    [
        "<h1>Unclosed heading<p>body",
        "<nav>never closed <p>lost",
        "</p></div></h2></script>stray ends",
        "<![if !supportLists]>odd<![endif]>",
        "<!DOCTYPE html [ <!ENTITY x 'y'> ]>text",
        "<!bogus [ <p>x",
        "<title>never closed<p>body text",
        "<p a='1' b=\"2\" c>&nbsp;&bogus;&#xZZ;&#99999999;</p>",
        "<<<>>>&&&",
        "",
    ],
)
def test_html_malformed_never_raises(tmp_path: Path, text: str) -> None:
    sections = read_sections(_write(tmp_path, "odd.html", text))
    assert all(isinstance(s, Section) and s.text.strip() for s in sections)


def test_html_unclosed_heading_and_title(tmp_path: Path) -> None:
    path = _write(tmp_path, "u.html", "<title>T<h1>Unclosed<p>body<h2>Next</h2>more")
    assert _pairs(path) == [("Unclosed", "body"), ("Next", "more")]


def test_html_title_paths_anchors_and_pre() -> None:
    sections = read_sections(DATA / "page.html")
    assert [(s.path_title, s.anchor) for s in sections] == [
        ("Simple statements", "simple-statements"),
        # The label's id (Sphinx's span before the heading), as the reST reader takes `.. _global:`.
        ("Simple statements › The global statement", "global"),
    ]
    assert sections[1].blocks[-1].code and sections[1].blocks[-1].text == "global x\n\nx = 1"


def test_html_text_after_markup_html_parser_gave_up_on_is_kept(tmp_path: Path) -> None:
    # html.parser raised on this marked section, and the text after it was lost.
    path = _write(tmp_path, "m.html", "<p>before</p><![foo[ x ]]><h1>Kept</h1><p>after</p>")
    assert _pairs(path) == [("m", "before"), ("Kept", "after")]
