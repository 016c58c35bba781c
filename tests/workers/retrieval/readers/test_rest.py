"""reStructuredText and plain text: titles, literal blocks, descriptions."""

from __future__ import annotations

from pathlib import Path

from ragline.workers.retrieval.readers import read_document, read_sections

# Shared with tests/workers/retrieval/test_chunking.py.
DATA = Path(__file__).parents[1] / "data"


def _pairs(path: Path) -> list[tuple[str, str]]:
    """Each section's own heading and text."""
    return [(s.title, s.text) for s in read_sections(path)]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_txt_is_one_section_titled_with_stem(tmp_path: Path) -> None:
    path = _write(tmp_path, "notes.txt", "\n  line one\nline two  \n\n")
    # Line breaks inside a paragraph are only wrapping.
    assert _pairs(path) == [("notes", "line one line two")]


def test_empty_txt_has_no_sections(tmp_path: Path) -> None:
    assert _pairs(_write(tmp_path, "empty.txt", "  \n\n")) == []


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


def test_plain_text_underlined_headings_are_titles(tmp_path: Path) -> None:
    # pydoc's topics, which `ragline demo` ingests, are plain text with reST-style underlines.
    text = 'The "global" statement\n**********************\n\nThe "global" statement is a declaration.\n'
    [section] = read_sections(_write(tmp_path, "global.txt", text))
    assert (section.title, section.anchor, section.text) == (
        'The "global" statement',
        "the-global-statement",
        'The "global" statement is a declaration.',
    )


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
