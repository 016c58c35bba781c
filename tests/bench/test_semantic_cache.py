"""bench/semantic_cache.py's labelled set and its choice of threshold (no encoder, no Redis)."""

from __future__ import annotations

import dataclasses

from bench.semantic_cache import DEFAULT_PAIRS, Classes, Pair, Row, choose, read_pairs


def test_the_labelled_set_has_enough_of_both_kinds() -> None:
    pairs = read_pairs(DEFAULT_PAIRS)
    assert len(pairs) >= 300
    assert len({(p.earlier, p.later) for p in pairs}) == len(pairs)  # no pair twice
    assert sum(p.same for p in pairs) >= 150 and sum(not p.same for p in pairs) >= 150
    # No near-miss joins, through paraphrase labels, the two questions it says differ.
    classes = Classes(pairs)
    for p in pairs:
        if not p.same:
            assert not classes.same(p.earlier, p.later), p


def test_paraphrase_labels_join_questions_into_classes() -> None:
    classes = Classes([Pair("a", "b", True), Pair("c", "b", True), Pair("a", "d", False)])
    assert classes.same("a", "c")
    assert not classes.same("a", "d")


def _row(threshold: float, false_hit_rate: float, miss_pairs_above: float = 0.0) -> Row:
    return Row(threshold, 0.5, 0.5, false_hit_rate, 0.0, miss_pairs_above, 0.5, 10)


def test_the_default_is_the_lowest_threshold_safe_at_and_above_it() -> None:
    rows = [_row(0.8, 0.05), _row(0.85, 0.0), _row(0.9, 0.02), _row(0.95, 0.0), _row(0.99, 0.0)]
    # 0.85 is safe alone, between two unsafe ones: not chosen.
    assert choose(rows, 0.01) == rows[3]
    assert choose([dataclasses.replace(r, false_hit_rate=0.0) for r in rows], 0.01) == dataclasses.replace(
        rows[0], false_hit_rate=0.0
    )
    # The near-miss pairs above a threshold count too.
    assert choose([_row(0.9, 0.0, miss_pairs_above=0.02), _row(0.95, 0.0)], 0.01) == _row(0.95, 0.0)
    assert choose([_row(0.9, 0.5)], 0.01) is None
