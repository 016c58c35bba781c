from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragline.broker.config.settings import RetrievalSettings
from ragline.workers.retrieval.chunking import Chunk, chunk_sections
from ragline.workers.retrieval.readers import TITLE_SEPARATOR, Block, Section, read_sections, slug

DATA = Path(__file__).parent / "data"


def _section(title: str, *texts: str, code: tuple[int, ...] = (), description: bool = False) -> Section:
    """A section of one heading with a paragraph per text (the ones at ``code`` are code blocks)."""
    blocks = tuple(Block(t, code=i in code) for i, t in enumerate(texts))
    return Section((title,), slug(title), blocks, description)


def _words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def _prefix(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()[:10]


def test_windows_and_overlap() -> None:
    chunks = chunk_sections([_section("T", _words(10))], source="doc.md", chunk_words=4, overlap_words=1)
    assert [c.text for c in chunks] == [
        "w0 w1 w2 w3",
        "w3 w4 w5 w6",
        "w6 w7 w8 w9",
    ]
    assert all(c.title == "T" and c.source == "doc.md" for c in chunks)


def test_short_trailing_window_is_kept() -> None:
    chunks = chunk_sections([_section("T", _words(9))], source="s", chunk_words=4, overlap_words=1)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8"]


def test_no_trailing_window_contained_in_previous() -> None:
    # Step 2 over 6 words: a window at w4 would only repeat the tail of the one at w2.
    chunks = chunk_sections([_section("T", _words(6))], source="s", chunk_words=4, overlap_words=2)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w2 w3 w4 w5"]


def test_no_overlap() -> None:
    chunks = chunk_sections([_section("T", _words(8))], source="s", chunk_words=4, overlap_words=0)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w4 w5 w6 w7"]


@pytest.mark.parametrize(("n_words", "expected"), [(1, 1), (5, 1), (6, 2), (7, 2), (8, 2), (9, 3), (50, 16)])
def test_window_counts(n_words: int, expected: int) -> None:
    # chunk 5, overlap 2, step 3: windows start at 0, 3, 6, ... until one reaches the end.
    chunks = chunk_sections([_section("T", _words(n_words))], source="s", chunk_words=5, overlap_words=2)
    assert len(chunks) == expected
    covered = {w for c in chunks for w in c.text.split()}
    assert covered == set(_words(n_words).split())
    assert chunks[-1].text.split()[-1] == f"w{n_words - 1}"


def test_short_section_is_one_chunk_and_whitespace_is_normalised() -> None:
    chunks = chunk_sections(
        [_section("Intro", "  alpha\n\tbeta   gamma \n")], source="s", chunk_words=100, overlap_words=10
    )
    assert [c.text for c in chunks] == ["alpha beta gamma"]


def test_title_is_not_prefixed_into_text() -> None:
    [chunk] = chunk_sections([_section("Heading", "body words")], source="s", chunk_words=5, overlap_words=0)
    assert chunk.text == "body words"
    assert chunk.title == "Heading"


def test_empty_sections_produce_nothing() -> None:
    assert chunk_sections([_section("E", "  \n ")], source="s", chunk_words=3, overlap_words=1) == []
    assert chunk_sections([], source="s", chunk_words=3, overlap_words=1) == []


def test_ids_count_across_sections_in_order_and_are_deterministic() -> None:
    sections = [_section("A", _words(5, "a")), _section("B", _words(2, "b")), _section("C", _words(4, "c"))]
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
    assert first[0] == Chunk(f"{prefix}-00000", "docs/guide.md", "A", "a0 a1 a2", ("a",), {})


def test_ids_differ_by_source() -> None:
    sections = [_section("A", "x y z")]
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
            [_section("T", "a b c")], source="s", chunk_words=chunk_words, overlap_words=overlap_words
        )


def test_invalid_parameters_raise_even_without_sections() -> None:
    with pytest.raises(ValueError):
        chunk_sections([], source="s", chunk_words=2, overlap_words=2)


def test_chunk_words_one() -> None:
    chunks = chunk_sections([_section("T", "a b c")], source="s", chunk_words=1, overlap_words=0)
    assert [c.text for c in chunks] == ["a", "b", "c"]


def test_blocks_are_packed_and_a_code_block_is_kept_whole() -> None:
    code = "\n".join(f"line{i} = {i}" for i in range(4))  # 12 words
    section = _section("T", _words(6, "a"), code, _words(6, "b"), code=(1,))
    chunks = chunk_sections([section], source="s", chunk_words=14, overlap_words=2)
    # The code block does not fit after the first paragraph, so the next chunk holds it whole,
    # after that paragraph's tail; code itself is never repeated.
    assert [c.text for c in chunks] == [_words(6, "a"), f"a4 a5\n\n{code}", _words(6, "b")]


def test_a_code_block_over_twice_the_size_is_cut_between_lines() -> None:
    code = "\n".join(f"x{i} = {i}" for i in range(10))  # 30 words, 3 a line
    chunks = chunk_sections([_section("T", code, code=(0,))], source="s", chunk_words=12, overlap_words=2)
    assert [c.text.count("\n") + 1 for c in chunks] == [4, 4, 2]
    assert "\n".join(c.text for c in chunks) == code


def test_a_section_in_several_chunks_repeats_the_tail_of_the_last_paragraph() -> None:
    section = _section("T", _words(5, "a"), _words(5, "b"), _words(5, "c"))
    chunks = chunk_sections([section], source="s", chunk_words=10, overlap_words=2)
    assert [c.text for c in chunks] == [
        f"{_words(5, 'a')}\n\n{_words(5, 'b')}",
        f"b3 b4\n\n{_words(5, 'c')}",
    ]


def test_short_descriptions_share_a_chunk_but_headed_sections_never_do() -> None:
    sections = [
        _section("COPY_BUFSIZE", "The buffer size.", description=True),
        _section("ARCHIVE_FORMATS", "Known formats.", description=True),
        _section("rmtree", _words(40), description=True),
        _section("Is it fast?", "Yes."),
        _section("Is it small?", "Yes."),
    ]
    chunks = chunk_sections(sections, source="s", chunk_words=100, overlap_words=10, min_words=30)
    assert [(c.title, c.anchors, c.text) for c in chunks] == [
        (
            "COPY_BUFSIZE",
            ("copy-bufsize", "archive-formats"),
            "The buffer size.\n\nARCHIVE_FORMATS\n\nKnown formats.",
        ),
        ("rmtree", ("rmtree",), _words(40)),
        ("Is it fast?", ("is-it-fast",), "Yes."),
        ("Is it small?", ("is-it-small",), "Yes."),
    ]


def test_real_rst_chunks_follow_its_sections() -> None:
    source = str(DATA / "shutil.rst")
    chunks = chunk_sections(
        read_sections(DATA / "shutil.rst"),
        source=source,
        chunk_words=60,
        overlap_words=10,
        min_words=30,
        meta={"path": "shutil.rst"},
    )
    heading = "shutil — High-level file operations › Directory and files operations"
    assert [(c.title, c.anchors) for c in chunks] == [
        ("shutil — High-level file operations", ("shutil-high-level-file-operations",)),
        (f"{heading} › shutil.copyfileobj", ("shutil.copyfileobj",)),
        (f"{heading} › shutil.rmtree", ("shutil.rmtree",)),
        (f"{heading} › shutil.rmtree", ("shutil.rmtree",)),
        (f"{heading} › shutil.COPY_BUFSIZE", ("shutil.COPY_BUFSIZE", "shutil.ARCHIVE_FORMATS")),
        (heading, ("directory-and-files-operations",)),
    ]
    # rmtree's prose fills its first chunk; its code example is whole in the second.
    assert chunks[3].text.endswith('import shutil\n\nshutil.rmtree("build")')
    assert all(c.meta == {"path": "shutil.rst"} and c.embed_text.startswith(c.title + "\n") for c in chunks)


# -- sizes bounded whatever the text (issue 32) ----------------------------------------------------

DEFAULTS = RetrievalSettings()


def test_a_word_longer_than_the_cap_is_cut_into_chunks_within_it() -> None:
    # One "word" (no spaces) is one word to the chunker: it used to become one chunk of any size.
    word = "x" * 300_011
    chunks = chunk_sections([_section("T", word)], source="s", chunk_words=200, overlap_words=40)
    cap = DEFAULTS.chunk_max_chars
    assert chunks and all(len(c.text) <= cap for c in chunks)
    assert "".join(c.text for c in chunks) == word


def test_prose_and_code_past_the_cap_are_cut_between_words_and_lines() -> None:
    prose = " ".join(["abcdefghi"] * 30)  # 299 characters, 30 words
    code = "\n".join([f"line_{i:03d} = {i}" for i in range(30)])
    chunks = chunk_sections(
        [_section("T", prose, code, code=(1,))], source="s", chunk_words=200, overlap_words=0, max_chars=50
    )
    assert all(len(c.text) <= 50 for c in chunks)
    # Cut between words and between lines: no word and no line is broken.
    assert all(w == "abcdefghi" for c in chunks if not c.text.startswith("line_") for w in c.text.split())
    lines = [line for c in chunks if c.text.startswith("line_") for line in c.text.split("\n")]
    assert lines == code.split("\n")


def test_short_descriptions_share_a_chunk_only_within_the_cap() -> None:
    sections = [_section(f"d{i}", "y" * 30, description=True) for i in range(4)]
    chunks = chunk_sections(
        sections, source="s", chunk_words=100, overlap_words=0, min_words=30, max_chars=80
    )
    assert all(len(c.text) <= 80 for c in chunks) and len(chunks) == 2
    # One over the cap on its own is cut as any long section is, not joined to the others.
    sections.insert(1, _section("long", "z" * 200, description=True))
    chunks = chunk_sections(
        sections, source="s", chunk_words=100, overlap_words=0, min_words=30, max_chars=80
    )
    assert all(len(c.text) <= 80 for c in chunks)
    assert "".join(c.text for c in chunks if c.title == "long") == "z" * 200


_TEXT = st.text(alphabet=st.sampled_from("ab \n\u4e2d"), max_size=400)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blocks=st.lists(st.tuples(_TEXT, st.booleans()), min_size=1, max_size=6),
    max_chars=st.integers(1, 120),
    chunk_words=st.integers(1, 40),
)
def test_no_chunk_is_longer_than_the_cap_and_nothing_is_lost(
    blocks: list[tuple[str, bool]], max_chars: int, chunk_words: int
) -> None:
    section = Section(("T",), "t", tuple(Block(t, code=c) for t, c in blocks if t.strip()))
    chunks = chunk_sections(
        [section], source="s", chunk_words=chunk_words, overlap_words=0, max_chars=max_chars
    )
    assert all(len(c.text) <= max_chars for c in chunks)
    # No overlap asked: every character but spacing comes out once, in order.
    assert "".join("".join(c.text.split()) for c in chunks) == "".join(
        "".join(b.text.split()) for b in section.blocks
    )


def test_a_long_heading_is_capped_in_the_title_and_its_anchor() -> None:
    heading = "H" * 16_384
    chunks = chunk_sections(
        [_section(heading, _words(50))], source="s", chunk_words=10, overlap_words=0, title_max_chars=40
    )
    assert len(chunks) == 5
    assert all(c.title == "H" * 39 + "…" and len(c.anchor) == 40 for c in chunks)
    # What is embedded is the capped title.
    assert all(len(c.embed_text) <= 40 + 1 + len(c.text) for c in chunks)


def test_a_long_title_path_drops_its_outer_headings_first() -> None:
    path = tuple(f"level {i} " + "w" * 20 for i in range(10))  # 28 characters each
    section = Section(path, "leaf", (Block("text"),))
    [chunk] = chunk_sections(
        [section], source="s", chunk_words=10, overlap_words=0, title_max_chars=30, title_path_max_chars=90
    )
    assert len(chunk.title) <= 90
    assert chunk.title.startswith("… › ") and chunk.title.endswith(path[-1])
    # "… › " and three headings with their separators would be 94 characters: two fit.
    assert chunk.title == TITLE_SEPARATOR.join(["…", *path[-2:]])


def test_the_default_title_caps_hold() -> None:
    section = Section(tuple("t" * 5000 for _ in range(20)), "a", (Block("text"),))
    [chunk] = chunk_sections([section], source="s", chunk_words=10, overlap_words=0)
    assert len(chunk.title) <= DEFAULTS.title_path_max_chars
    assert len(chunk.anchor) <= DEFAULTS.title_max_chars


def test_every_chunk_of_a_document_shares_one_metadata_mapping() -> None:
    chunks = chunk_sections(
        [_section("T", _words(50))], source="s", chunk_words=10, overlap_words=0, meta={"team": "x" * 1000}
    )
    assert len(chunks) == 5 and len({id(c.meta) for c in chunks}) == 1
