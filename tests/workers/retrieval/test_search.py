"""Ranking a query's candidates: filters, reciprocal-rank fusion, the diversity caps."""

from __future__ import annotations

from ragline.broker.contract.messages import PrefixMatch, filter_key
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.search import Candidate, allowed_rows, diversify, fuse, matches, search_depth


def _chunk(i: int, source: str, anchor: str, **meta: str) -> Chunk:
    return Chunk(f"c{i}", source, f"T › {anchor}", "text", (anchor,), meta)


def test_fusion_adds_reciprocal_ranks_and_keeps_the_cosine() -> None:
    fused = fuse([(1, 0.9), (2, 0.8)], [(2, 12.0), (3, 9.0)], rrf_k=60, dense_weight=1, lexical_weight=1)
    assert [c.row for c in fused] == [2, 1, 3]  # found by both first
    assert fused[0].score == 1 / 62 + 1 / 61
    assert [c.dense for c in fused] == [0.8, 0.9, None]
    lexical_heavy = fuse([(1, 0.9)], [(3, 9.0)], rrf_k=60, dense_weight=1, lexical_weight=2)
    assert [c.row for c in lexical_heavy] == [3, 1]


def test_diversity_caps_sections_and_files_and_fills_up_when_too_few() -> None:
    chunks = [
        _chunk(0, "a.rst", "x"),
        _chunk(1, "a.rst", "x"),
        _chunk(2, "a.rst", "y"),
        _chunk(3, "a.rst", "z"),
        _chunk(4, "b.rst", "x"),
    ]
    ranked = [Candidate(i, 1 - i / 10) for i in range(5)]
    top = diversify(ranked, chunks, 3, per_section=1, per_file=2)
    assert [c.row for c in top] == [0, 2, 4]  # 1: section x again; 3: a third of a.rst
    everything = diversify(ranked, chunks, 5, per_section=1, per_file=2)
    assert [c.row for c in everything] == [0, 1, 2, 3, 4]  # too few distinct: filled, in rank order
    assert [c.row for c in diversify(ranked, chunks, 3, per_section=0, per_file=0)] == [0, 1, 2]


def test_filters_equality_membership_prefix_and_missing_keys() -> None:
    chunks = [
        _chunk(0, "/d/library/os.rst", "os", path="library/os.rst", lang="en"),
        _chunk(1, "/d/library/re.rst", "re", path="library/re.rst", lang="fr"),
        _chunk(2, "/d/tutorial/a.rst", "a", path="tutorial/a.rst"),
    ]
    assert allowed_rows(chunks, {"path": PrefixMatch(prefix="library/")}).tolist() == [0, 1]
    assert allowed_rows(chunks, {"lang": "fr"}).tolist() == [1]
    assert allowed_rows(chunks, {"lang": ["en", "fr"], "path": PrefixMatch(prefix="library/o")}).tolist() == [
        0
    ]
    assert allowed_rows(chunks, {"team": "x"}).tolist() == []  # a key a chunk lacks never matches
    assert matches(chunks[2], {"title": PrefixMatch(prefix="T › ")})
    assert filter_key({"b": "1", "a": ["x"]}) == filter_key({"a": ["x"], "b": "1"}) != filter_key(None)


def test_search_depth_is_the_candidates_and_at_least_twice_top_k() -> None:
    assert search_depth(50, 10) == 50
    assert search_depth(50, 40) == 80
