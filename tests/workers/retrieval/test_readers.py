from __future__ import annotations

from pathlib import Path

import pytest

from workers.retrieval.readers import SUPPORTED_SUFFIXES, Section, is_supported, read_document, read_sections


def _pairs(path: Path) -> list[tuple[str, str]]:
    """Each section's own heading and text."""
    return [(s.title, s.text) for s in read_sections(path)]


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
    # Line breaks inside a paragraph are only wrapping.
    assert _pairs(path) == [("notes", "line one line two")]


def test_empty_txt_has_no_sections(tmp_path: Path) -> None:
    assert _pairs(_write(tmp_path, "empty.txt", "  \n\n")) == []


def test_invalid_utf8_is_replaced_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok \xff\xfe bytes")
    [section] = read_sections(path)
    assert section.text == "ok \ufffd\ufffd bytes"


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes("\ufeff# Title\nbody\n".encode())
    assert _pairs(path) == [("Title", "body")]


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
    sections = _pairs(_write(tmp_path, "a.md", "# A\n```\n# inside\n"))
    assert sections == [("A", "```\n# inside")]


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
    assert sections[2].text == "Install body.\n\nToo Long Title ~~~"
    assert sections[3].text == "Short title body.\n\n----------\n\nAfter a transition."


def test_rst_paragraph_line_above_rule_is_not_a_title(tmp_path: Path) -> None:
    text = "Title\n=====\n\nfirst line\nsecond line\n-----------\n"
    assert _pairs(_write(tmp_path, "a.rst", text)) == [("Title", "first line second line -----------")]


def test_rst_indented_literal_block_is_not_a_title(tmp_path: Path) -> None:
    text = "Usage\n=====\n\nExample::\n\n    code line\n    ---------\n"
    [section] = read_sections(_write(tmp_path, "a.rst", text))
    assert section.title == "Usage"
    # The literal block is a code block of its own, kept whole.
    assert section.text == "Example:\n\ncode line\n---------"
    assert [b.code for b in section.blocks] == [False, True]


def test_rst_txt_file_uses_rst_reader_and_stem(tmp_path: Path) -> None:
    text = "Leading words.\n\nChapter\n*******\n\nChapter words.\n"
    assert _pairs(_write(tmp_path, "manual.rst.txt", text)) == [
        ("manual", "Leading words."),
        ("Chapter", "Chapter words."),
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


@pytest.mark.parametrize("suffix", [".md", ".rst", ".rst.txt", ".txt"])
def test_odd_text_never_raises(tmp_path: Path, suffix: str) -> None:
    text = "#\n#\n```\n===\n\x00\x01\n" + "=" * 3 + "\n\n" + "-" * 80 + "\n" + "#" * 7 + "\n\u2028"
    sections = read_sections(_write(tmp_path, "odd" + suffix, text))
    assert all(s.text.strip() for s in sections)


# --- structure: title paths, anchors, code blocks, front matter (tests/workers/retrieval/data) -----

DATA = Path(__file__).parent / "data"


def test_rst_title_paths_anchors_and_literal_blocks() -> None:
    document = read_document(DATA / "statements.rst")
    assert document.meta == {"tocdepth": "2"}
    sections = document.sections
    assert [(s.path_title, s.anchor) for s in sections] == [
        ("Simple statements", "simple"),
        ("Simple statements › The pass statement", "pass"),
        ("Simple statements › The global statement", "global"),
        # No label above it: the anchor Sphinx makes from the heading.
        ("Simple statements › The global statement › Programmer's note", "programmer-s-note"),
    ]
    pass_section = sections[1]
    # Roles lose their markup; the literal block after "::" is one code block, blank lines kept.
    assert pass_section.blocks[0].text.startswith("pass is a null operation — when")
    [code] = [b for b in pass_section.blocks if b.code]
    assert code.text == (
        "def f(arg): pass    # a function that does nothing (yet)\n"
        "\n"
        "class C: pass       # a class with no methods (yet)"
    )
    assert "Changed in version 3.6." in sections[2].text
    assert "pair: simple" not in " ".join(s.text for s in sections)  # index entries are not text


def test_rst_descriptions_are_sections_under_their_heading() -> None:
    sections = read_sections(DATA / "shutil.rst")
    assert [(s.path_title, s.anchor, s.description) for s in sections] == [
        ("shutil — High-level file operations", "shutil-high-level-file-operations", False),
        (
            "shutil — High-level file operations › Directory and files operations › shutil.copyfileobj",
            "shutil.copyfileobj",
            True,
        ),
        (
            "shutil — High-level file operations › Directory and files operations › shutil.rmtree",
            "shutil.rmtree",
            True,
        ),
        (
            "shutil — High-level file operations › Directory and files operations › shutil.COPY_BUFSIZE",
            "shutil.COPY_BUFSIZE",
            True,
        ),
        (
            "shutil — High-level file operations › Directory and files operations › shutil.ARCHIVE_FORMATS",
            "shutil.ARCHIVE_FORMATS",
            True,
        ),
        # Text at column 0 after the descriptions belongs to their heading again.
        (
            "shutil — High-level file operations › Directory and files operations",
            "directory-and-files-operations",
            False,
        ),
    ]
    rmtree = sections[2]
    assert rmtree.blocks[0].text.startswith("function:: rmtree(path")
    [code] = [b for b in rmtree.blocks if b.code]
    assert code.text == 'import shutil\n\nshutil.rmtree("build")'


def test_markdown_title_paths_front_matter_and_fences() -> None:
    document = read_document(DATA / "guide.md")
    assert document.meta == {"product": "ragline", "audience": "operators"}
    assert [(s.path_title, s.anchor) for s in document.sections] == [
        ("Operating ragline", "operating-ragline"),
        ("Operating ragline › Install", "install"),
        ("Operating ragline › Configure it › Environment variables", "environment-variables"),
    ]
    [code] = [b for b in document.sections[1].blocks if b.code]
    assert code.text == "```sh\n# not a heading: a shell comment\n\nbash deploy/install.sh\n```"


def test_html_title_paths_anchors_and_pre() -> None:
    sections = read_sections(DATA / "page.html")
    assert [(s.path_title, s.anchor) for s in sections] == [
        ("Simple statements", "simple-statements"),
        # The label's id (Sphinx's span before the heading), as the reST reader takes `.. _global:`.
        ("Simple statements › The global statement", "global"),
    ]
    assert sections[1].blocks[-1].code and sections[1].blocks[-1].text == "global x\n\nx = 1"


def test_plain_text_underlined_headings_are_titles(tmp_path: Path) -> None:
    # pydoc's topics, which `ragline demo` ingests, are plain text with reST-style underlines.
    text = 'The "global" statement\n**********************\n\nThe "global" statement is a declaration.\n'
    [section] = read_sections(_write(tmp_path, "global.txt", text))
    assert (section.title, section.anchor, section.text) == (
        'The "global" statement',
        "the-global-statement",
        'The "global" statement is a declaration.',
    )
