"""bench/gpu/encoder.py: its passages are distinct, ~200 words each, from the repository's docs."""

from __future__ import annotations

from bench.gpu.encoder import WORDS_PER_PASSAGE, passages


def test_passages_are_distinct_and_passage_sized() -> None:
    texts = passages(300)
    assert len(texts) == len(set(texts)) == 300
    assert all(len(t.split()) <= WORDS_PER_PASSAGE + 1 for t in texts)
    assert sum(len(t.split()) for t in texts) / len(texts) > WORDS_PER_PASSAGE / 2
