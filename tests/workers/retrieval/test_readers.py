from __future__ import annotations

from pathlib import Path

import pytest

from workers.retrieval.readers import SUPPORTED_SUFFIXES, Section, is_supported, read_sections


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.txt", True),
        ("a.md", True),
        ("a.MD", True),
        ("a.rst", True),
        ("guide.rst.txt", True),
        ("GUIDE.RST.TXT", True),
        ("a.html", True),
        ("a.HTM", True),
        ("a.pdf", False),
        ("a.markdown", False),
        ("md", False),
    ],
)
def test_is_supported(name: str, expected: bool) -> None:
    assert is_supported(Path(name)) is expected


def test_supported_suffixes() -> None:
    assert SUPPORTED_SUFFIXES == (".txt", ".md", ".rst", ".rst.txt", ".html", ".htm")


def test_unsupported_suffix_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported"):
        read_sections(_write(tmp_path, "a.pdf", "x"))


def test_txt_is_one_section_titled_with_stem(tmp_path: Path) -> None:
    path = _write(tmp_path, "notes.txt", "\n  line one\nline two  \n\n")
    assert read_sections(path) == [Section("notes", "line one\nline two")]


def test_empty_txt_has_no_sections(tmp_path: Path) -> None:
    assert read_sections(_write(tmp_path, "empty.txt", "  \n\n")) == []


def test_invalid_utf8_is_replaced_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok \xff\xfe bytes")
    [section] = read_sections(path)
    assert section.text == "ok \ufffd\ufffd bytes"


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes("\ufeff# Title\nbody\n".encode())
    assert read_sections(path) == [Section("Title", "body")]


def test_markdown_headings_and_code_fence(tmp_path: Path) -> None:
    text = (
        "Intro paragraph.\n"
        "\n"
        "# Install\n"
        "Run the installer.\n"
        "\n"
        "```bash\n"
        "# not a heading, a shell comment\n"
        "pip install ragline\n"
        "```\n"
        "\n"
        "## Configure ##\n"
        "Set the env vars.\n"
        "~~~~\n"
        "### still code\n"
        "~~~\n"
        "####### seven hashes is text\n"
        "~~~~\n"
        "#hashtag is text too\n"
        "### Empty\n"
        "   \n"
        "###### Deep\n"
        "deep text\n"
    )
    sections = read_sections(_write(tmp_path, "guide.md", text))
    assert [s.title for s in sections] == ["guide", "Install", "Configure", "Deep"]
    assert sections[0].text == "Intro paragraph."
    assert sections[1].text == (
        "Run the installer.\n\n```bash\n# not a heading, a shell comment\npip install ragline\n```"
    )
    assert "### still code" in sections[2].text
    assert "####### seven hashes is text" in sections[2].text
    assert sections[2].text.endswith("#hashtag is text too")
    assert sections[3].text == "deep text"


def test_markdown_unclosed_fence_runs_to_end(tmp_path: Path) -> None:
    sections = read_sections(_write(tmp_path, "a.md", "# A\n```\n# inside\n"))
    assert sections == [Section("A", "```\n# inside")]


def test_rst_underline_and_overline_styles(tmp_path: Path) -> None:
    text = (
        "Preamble text.\n"
        "\n"
        "==========\n"
        " Overview\n"
        "==========\n"
        "\n"
        "Overview body.\n"
        "\n"
        "Install\n"
        "-------\n"
        "\n"
        "Install body.\n"
        "\n"
        "Too Long Title\n"
        "~~~\n"
        "\n"
        "A\n"
        "^^^\n"
        "Short title body.\n"
        "\n"
        "----------\n"
        "\n"
        "After a transition.\n"
    )
    sections = read_sections(_write(tmp_path, "doc.rst", text))
    assert [s.title for s in sections] == ["doc", "Overview", "Install", "A"]
    assert sections[0].text == "Preamble text."
    assert sections[1].text == "Overview body."
    # A too-short underline is not a title, so it stays in the text.
    assert sections[2].text == "Install body.\n\nToo Long Title\n~~~"
    assert sections[3].text == "Short title body.\n\n----------\n\nAfter a transition."


def test_rst_paragraph_line_above_rule_is_not_a_title(tmp_path: Path) -> None:
    text = "Title\n=====\n\nfirst line\nsecond line\n-----------\n"
    assert read_sections(_write(tmp_path, "a.rst", text)) == [
        Section("Title", "first line\nsecond line\n-----------")
    ]


def test_rst_indented_literal_block_is_not_a_title(tmp_path: Path) -> None:
    text = "Usage\n=====\n\nExample::\n\n    code line\n    ---------\n"
    [section] = read_sections(_write(tmp_path, "a.rst", text))
    assert section.title == "Usage"
    assert section.text == "Example::\n\n    code line\n    ---------"


def test_rst_txt_file_uses_rst_reader_and_stem(tmp_path: Path) -> None:
    text = "Leading words.\n\nChapter\n*******\n\nChapter words.\n"
    assert read_sections(_write(tmp_path, "manual.rst.txt", text)) == [
        Section("manual", "Leading words."),
        Section("Chapter", "Chapter words."),
    ]


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
    assert sections == [
        Section("The Guide", "Intro text across lines."),
        Section("First & Foremost", "Para one.\nPara two\nafter break.\nDiv text"),
        Section("Lists", "one\ntwo\na b\nc\nline 1\nline 2"),
    ]
    joined = " ".join(s.title + " " + s.text for s in sections)
    for hidden in ("color", "fake", "hidden", "Home", "Nav heading"):
        assert hidden not in joined


def test_html_block_wrapped_heading_text(tmp_path: Path) -> None:
    path = _write(tmp_path, "w.html", "<h1><div>Wrapped</div> <span>Title</span></h1><p>body</p>")
    assert read_sections(path) == [Section("Wrapped Title", "body")]


def test_html_without_head_or_title_uses_stem(tmp_path: Path) -> None:
    sections = read_sections(_write(tmp_path, "bare.htm", "plain <b>bold</b> text<h2>H</h2>more"))
    assert sections == [Section("bare", "plain bold text"), Section("H", "more")]


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
    assert read_sections(path) == [Section("Unclosed", "body"), Section("Next", "more")]


@pytest.mark.parametrize("suffix", [".md", ".rst", ".rst.txt", ".txt"])
def test_odd_text_never_raises(tmp_path: Path, suffix: str) -> None:
    text = "#\n#\n```\n===\n\x00\x01\n" + "=" * 3 + "\n\n" + "-" * 80 + "\n" + "#" * 7 + "\n\u2028"
    sections = read_sections(_write(tmp_path, "odd" + suffix, text))
    assert all(s.text.strip() for s in sections)
