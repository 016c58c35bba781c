"""Metadata filters from columns of codes, under one memory budget: the same rows as a match
chunk by chunk, whatever the filter; at most the budget kept however many distinct filters come;
least recently used out first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.broker.contract.messages import MetadataFilter, PrefixMatch, filter_key
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.filter_rows import FilterCache, build_column, filter_rows
from ragline.workers.retrieval.search import allowed_rows

pytestmark = pytest.mark.unit

# Few letters, so values share prefixes and collide often.
_text = st.text(alphabet="ab/é", max_size=4)
_meta = st.dictionaries(st.sampled_from(["lang", "path", "team"]), _text, max_size=3)
_chunks = st.lists(st.tuples(_text, _meta), max_size=40).map(
    lambda rows: [Chunk(f"c{i}", "f.md", title, "text", meta=meta) for i, (title, meta) in enumerate(rows)]
)
_wanted = st.one_of(
    _text, st.lists(_text, min_size=1, max_size=3), _text.map(lambda p: PrefixMatch(prefix=p))
)
_filters = st.dictionaries(
    st.sampled_from(["lang", "path", "team", "title", "absent"]), _wanted, min_size=1, max_size=3
)


@settings(max_examples=300, deadline=None)
@given(chunks=_chunks, flt=_filters)
def test_columns_let_through_exactly_the_rows_a_chunk_by_chunk_match_does(
    chunks: list[Chunk], flt: MetadataFilter
) -> None:
    rows = filter_rows(FilterCache(), "i", "v1", chunks, flt)
    assert rows.dtype == np.int64
    assert rows.tolist() == allowed_rows(chunks, flt).tolist()


def _many(n: int) -> list[Chunk]:
    return [Chunk(f"c{i}", "f.md", "T", "x", meta={"id": f"doc-{i:05d}", "lang": "en"}) for i in range(n)]


def test_distinct_filters_stay_within_the_byte_budget() -> None:
    chunks = _many(5000)
    budget = 256 * 1024
    cache = FilterCache(budget)
    for i in range(400):  # each its own filter, a fifth of the rows passing the first
        flt: MetadataFilter = {"id": PrefixMatch(prefix=f"doc-0{i % 5}"), "lang": ["en", f"x{i}"]}
        rows = filter_rows(cache, "i", "v1", chunks, flt)
        assert len(rows) == 1000
        filter_rows(cache, "i", "v1", chunks, {"id": f"doc-{i:05d}"})
        assert cache.bytes <= budget
    assert len(cache) > 2  # something is kept


def test_least_recently_used_goes_first_and_nothing_outlives_its_version() -> None:
    chunks = _many(100)
    one = filter_rows(FilterCache(), "i", "v1", chunks, {"id": "doc-00001"})
    cost = FilterCache()
    filter_rows(cost, "i", "v1", chunks, {"id": "doc-00001"})
    cache = FilterCache(cost.bytes + 2 * (one.nbytes + 256) + 1)  # room for two more results
    for doc in ("doc-00001", "doc-00002", "doc-00003"):
        filter_rows(cache, "i", "v1", chunks, {"id": doc})
    filter_rows(cache, "i", "v1", chunks, {"id": "doc-00001"})  # used again: now the newest
    filter_rows(cache, "i", "v1", chunks, {"id": "doc-00004"})
    kept = {key[2] for key in cache._entries}
    assert "rows:" + filter_key({"id": "doc-00001"}) in kept, kept
    assert "rows:" + filter_key({"id": "doc-00002"}) not in kept, kept
    cache.forget("i", keep="v2")
    assert len(cache) == 0 and cache.bytes == 0


def test_a_field_no_chunk_has_costs_no_column() -> None:
    cache = FilterCache()
    assert filter_rows(cache, "i", "v1", _many(50), {"nobody": "x"}).tolist() == []
    assert not [key for key in cache._entries if key[2].startswith("column:")]


def test_something_larger_than_the_budget_is_computed_not_kept() -> None:
    cache = FilterCache(1024)
    assert len(filter_rows(cache, "i", "v1", _many(2000), {"lang": "en"})) == 2000
    assert cache.bytes <= 1024


def test_a_prefix_is_a_range_of_sorted_codes() -> None:
    chunks = [
        Chunk(f"c{i}", "f.md", "T", "x", meta={"path": p})
        for i, p in enumerate(["b/1", "a/2", "a/1", "ab", "a"])
    ]
    column = build_column(chunks, "path")
    assert column.values == ["a", "a/1", "a/2", "ab", "b/1"]
    assert np.flatnonzero(column.mask(PrefixMatch(prefix="a/"))).tolist() == [1, 2]
    assert np.flatnonzero(column.mask(PrefixMatch(prefix=""))).tolist() == [0, 1, 2, 3, 4]
