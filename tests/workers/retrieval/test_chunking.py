from __future__ import annotations

import hashlib

import pytest

from workers.retrieval.chunking import Chunk, chunk_sections
from workers.retrieval.readers import Section


def _words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def _prefix(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()[:10]


def test_windows_and_overlap() -> None:
    chunks = chunk_sections([Section("T", _words(10))], source="doc.md", chunk_words=4, overlap_words=1)
    assert [c.text for c in chunks] == [
        "w0 w1 w2 w3",
        "w3 w4 w5 w6",
        "w6 w7 w8 w9",
    ]
    assert all(c.title == "T" and c.source == "doc.md" for c in chunks)


def test_short_trailing_window_is_kept() -> None:
    chunks = chunk_sections([Section("T", _words(9))], source="s", chunk_words=4, overlap_words=1)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8"]


def test_no_trailing_window_contained_in_previous() -> None:
    # Step 2 over 6 words: a window at w4 would only repeat the tail of the one at w2.
    chunks = chunk_sections([Section("T", _words(6))], source="s", chunk_words=4, overlap_words=2)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w2 w3 w4 w5"]


def test_no_overlap() -> None:
    chunks = chunk_sections([Section("T", _words(8))], source="s", chunk_words=4, overlap_words=0)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w4 w5 w6 w7"]


@pytest.mark.parametrize(("n_words", "expected"), [(1, 1), (5, 1), (6, 2), (7, 2), (8, 2), (9, 3), (50, 16)])
def test_window_counts(n_words: int, expected: int) -> None:
    # chunk 5, overlap 2, step 3: windows start at 0, 3, 6, ... until one reaches the end.
    chunks = chunk_sections([Section("T", _words(n_words))], source="s", chunk_words=5, overlap_words=2)
    assert len(chunks) == expected
    covered = {w for c in chunks for w in c.text.split()}
    assert covered == set(_words(n_words).split())
    assert chunks[-1].text.split()[-1] == f"w{n_words - 1}"


def test_short_section_is_one_chunk_and_whitespace_is_normalised() -> None:
    chunks = chunk_sections(
        [Section("Intro", "  alpha\n\tbeta   gamma \n")], source="s", chunk_words=100, overlap_words=10
    )
    assert [c.text for c in chunks] == ["alpha beta gamma"]


def test_title_is_not_prefixed_into_text() -> None:
    [chunk] = chunk_sections([Section("Heading", "body words")], source="s", chunk_words=5, overlap_words=0)
    assert chunk.text == "body words"
    assert chunk.title == "Heading"


def test_empty_sections_produce_nothing() -> None:
    assert chunk_sections([Section("E", "  \n ")], source="s", chunk_words=3, overlap_words=1) == []
    assert chunk_sections([], source="s", chunk_words=3, overlap_words=1) == []


def test_ids_count_across_sections_in_order_and_are_deterministic() -> None:
    sections = [Section("A", _words(5, "a")), Section("B", _words(2, "b")), Section("C", _words(4, "c"))]
    first = chunk_sections(iter(sections), source="docs/guide.md", chunk_words=3, overlap_words=1)
    again = chunk_sections(sections, source="docs/guide.md", chunk_words=3, overlap_words=1)
    assert first == again
    prefix = _prefix("docs/guide.md")
    assert [c.chunk_id for c in first] == [f"{prefix}-{n:05d}" for n in range(len(first))]
    assert [(c.title, c.text) for c in first] == [
        ("A", "a0 a1 a2"),
        ("A", "a2 a3 a4"),
        ("B", "b0 b1"),
        ("C", "c0 c1 c2"),
        ("C", "c2 c3"),
    ]
    assert first[0] == Chunk(f"{prefix}-00000", "docs/guide.md", "A", "a0 a1 a2")


def test_ids_differ_by_source() -> None:
    sections = [Section("A", "x y z")]
    a = chunk_sections(sections, source="a.md", chunk_words=3, overlap_words=0)
    b = chunk_sections(sections, source="b.md", chunk_words=3, overlap_words=0)
    assert a[0].chunk_id != b[0].chunk_id
    assert a[0].chunk_id.startswith(_prefix("a.md") + "-")
    assert len(a[0].chunk_id) == 10 + 1 + 5


@pytest.mark.parametrize(
    ("chunk_words", "overlap_words"),
    [(0, 0), (-1, 0), (5, 5), (5, 6), (5, -1), (1, 1)],
)
def test_invalid_parameters_raise(chunk_words: int, overlap_words: int) -> None:
    with pytest.raises(ValueError):
        chunk_sections(
            [Section("T", "a b c")], source="s", chunk_words=chunk_words, overlap_words=overlap_words
        )


def test_invalid_parameters_raise_even_without_sections() -> None:
    with pytest.raises(ValueError):
        chunk_sections([], source="s", chunk_words=2, overlap_words=2)


def test_chunk_words_one() -> None:
    chunks = chunk_sections([Section("T", "a b c")], source="s", chunk_words=1, overlap_words=0)
    assert [c.text for c in chunks] == ["a", "b", "c"]
