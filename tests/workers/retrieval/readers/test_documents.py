"""Choosing a reader by the file's name, decoding, and odd text."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.workers.retrieval.readers import SUPPORTED_SUFFIXES, is_supported, read_sections


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


def test_invalid_utf8_is_replaced_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok \xff\xfe bytes")
    [section] = read_sections(path)
    assert section.text == "ok \ufffd\ufffd bytes"


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes("\ufeff# Title\nbody\n".encode())
    assert _pairs(path) == [("Title", "body")]


@pytest.mark.parametrize("suffix", [".md", ".rst", ".rst.txt", ".txt"])
def test_odd_text_never_raises(tmp_path: Path, suffix: str) -> None:
    text = "#\n#\n```\n===\n\x00\x01\n" + "=" * 3 + "\n\n" + "-" * 80 + "\n" + "#" * 7 + "\n\u2028"
    sections = read_sections(_write(tmp_path, "odd" + suffix, text))
    assert all(s.text.strip() for s in sections)
