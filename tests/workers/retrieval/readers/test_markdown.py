"""Markdown: headings, fences, title paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.workers.retrieval.readers import read_document, read_sections
from ragline.workers.retrieval.readers.markdown import atx_heading

# Shared with tests/workers/retrieval/test_chunking.py.
DATA = Path(__file__).parents[1] / "data"


def _pairs(path: Path) -> list[tuple[str, str]]:
    """Each section's own heading and text."""
    return [(s.title, s.text) for s in read_sections(path)]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


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


# The heading regex this reader used before it scanned instead (quadratic in a line of spaces):
# on short lines, the reference for what a heading is.
_FORMER_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")

_heading_like = st.text(st.sampled_from([" ", "\t", "#", "a", "b", "\r", "\x0b", "\u3000"]), max_size=14)


@settings(max_examples=500, deadline=None, database=None)
@given(_heading_like | st.text(max_size=24).map(lambda line: line.replace("\n", "")))
def test_atx_heading_reads_lines_as_the_former_regex(line: str) -> None:
    m = _FORMER_HEADING.match(line)
    expected = None if m is None else (len(m.group(1)), (m.group(2) or "").strip() or None)
    assert atx_heading(line) == expected


@pytest.mark.parametrize(
    ("line", "heading"),
    [
        ("## Configure ##", (2, "Configure")),
        ("#   spaced   title   ", (1, "spaced   title")),
        ("# a ## b ##", (1, "a ## b")),
        ("# title#", (1, "title#")),
        ("# ###", (1, "###")),
        ("#", (1, None)),
        ("   ### three spaces", (3, "three spaces")),
        ("    # four spaces is code", None),
        ("#hashtag", None),
        ("####### seven", None),
    ],
)
def test_atx_heading(line: str, heading: tuple[int, str | None] | None) -> None:
    assert atx_heading(line) == heading
