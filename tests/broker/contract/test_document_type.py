"""One definition of the file types ragline reads, asked by the API's upload check and the readers."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.broker.contract.messages import DOCUMENT_SUFFIXES, document_type
from ragline.workers.retrieval.readers import is_supported


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.txt", ".txt"),
        ("a.MD", ".md"),
        ("guide.rst.txt", ".rst.txt"),
        ("GUIDE.RST.TXT", ".rst.txt"),
        ("a.HTM", ".htm"),
        ("notes.md.html", ".html"),
        ("a.pdf", None),
        ("md", None),
        # No name before the type: nothing to title it by, and the API refuses it.
        (".md", None),
        (".rst.txt", None),
        ("..md", None),
        ("  .txt", None),
        (". .html", None),
    ],
)
def test_document_type(name: str, expected: str | None) -> None:
    assert document_type(name) == expected


@pytest.mark.parametrize("name", ["a.md", ".md", "x.rst.txt", ".rst.txt", "a.pdf", "..html", "b.HTM"])
def test_the_readers_read_what_the_contract_accepts(name: str) -> None:
    assert is_supported(Path(name)) is (document_type(name) is not None)


def test_every_suffix_is_read_as_itself() -> None:
    assert all(document_type("doc" + suffix) == suffix for suffix in DOCUMENT_SUFFIXES)
