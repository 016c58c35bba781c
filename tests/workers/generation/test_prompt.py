"""Prompts: fixed prefix, stable source order, lowest-scored sources dropped to fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.contract import ChatTurn, Source
from workers.generation.prompt import SYSTEM_PROMPT, build_prompt, citations


@pytest.fixture(scope="module")
def tokenizer(prepared_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_model)


def _sources(n: int, words: int = 30) -> list[Source]:
    return [
        Source(
            chunk_id=f"c{i:02d}",
            source="s",
            title=f"t{i}",
            text=" ".join([f"w{i}"] * words),
            score=1 - i / 10,
        )
        for i in range(n)
    ]


def test_stable_order_and_fixed_prefix(tokenizer) -> None:
    sources = _sources(3)
    a = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=2000)
    b = build_prompt(tokenizer, "q?", list(reversed(sources)), max_prompt_tokens=2000)
    assert a.text == b.text
    assert SYSTEM_PROMPT in a.text
    assert a.sources_dropped == 0 and a.sources_used == 3


def test_too_long_drops_lowest_scored(tokenizer) -> None:
    sources = _sources(6, words=60)
    full = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000)
    trimmed = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=full.prompt_tokens - 50)
    assert trimmed.sources_dropped >= 1
    assert trimmed.prompt_tokens <= full.prompt_tokens - 50
    assert "w5" not in trimmed.text and "w0" in trimmed.text


def test_source_budget_drops_lowest_scored(tokenizer) -> None:
    sources = _sources(6, words=60)
    full = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000)
    bare = build_prompt(tokenizer, "q?", [], max_prompt_tokens=10_000)
    budget = (full.prompt_tokens - bare.prompt_tokens) // 2
    trimmed = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000, max_source_tokens=budget)
    assert 1 <= trimmed.sources_used < 6 and trimmed.sources_dropped == 6 - trimmed.sources_used
    assert trimmed.prompt_tokens - bare.prompt_tokens <= budget
    assert "w0" in trimmed.text and "w5" not in trimmed.text


def test_sources_are_numbered_best_first_and_citations_map_back(tokenizer) -> None:
    sources = list(reversed(_sources(3)))
    built = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=2000)
    assert [s.chunk_id for s in built.numbered] == ["c00", "c01", "c02"]
    assert "[1] t0\n" in built.text and "[3] t2\n" in built.text
    cited = citations("It is w1 [2], see also [3][2] and [1, 9] but not [0] or [4].", built.numbered)
    assert [(c.marker, c.chunk_id, c.title) for c in cited] == [
        (2, "c01", "t1"),
        (3, "c02", "t2"),
        (1, "c00", "t0"),
    ]
    assert citations("No marker here.", built.numbered) == []


def _turns(n: int, words: int = 40) -> list[ChatTurn]:
    return [
        ChatTurn(role="user" if i % 2 == 0 else "assistant", content=" ".join([f"h{i}"] * words))
        for i in range(n)
    ]


def test_earlier_turns_come_between_the_system_prefix_and_the_sources(tokenizer) -> None:
    built = build_prompt(tokenizer, "q?", _sources(2), max_prompt_tokens=10_000, history=_turns(2))
    assert built.text.index(SYSTEM_PROMPT) < built.text.index("h0") < built.text.index("h1")
    assert built.text.index("h1") < built.text.index("[1] t0") < built.text.index("Question: q?")
    assert (built.turns_used, built.turns_dropped) == (2, 0)


def test_the_oldest_turns_go_first_then_the_sources(tokenizer) -> None:
    sources, turns = _sources(3), _turns(4)
    full = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000, history=turns)
    without_two = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000, history=turns[2:])
    trimmed = build_prompt(
        tokenizer, "q?", sources, max_prompt_tokens=without_two.prompt_tokens, history=turns
    )
    assert trimmed.turns_dropped == 2 and trimmed.sources_dropped == 0
    assert "h0" not in trimmed.text and "h1" not in trimmed.text and "h3" in trimmed.text
    assert full.prompt_tokens > trimmed.prompt_tokens
    bare = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000)
    tight = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=bare.prompt_tokens - 20, history=turns)
    assert tight.turns_used == 0 and tight.sources_dropped >= 1


def test_the_turns_budget_keeps_the_most_recent(tokenizer) -> None:
    turns = _turns(4)
    bare = build_prompt(tokenizer, "q?", [], max_prompt_tokens=10_000)
    one = build_prompt(tokenizer, "q?", [], max_prompt_tokens=10_000, history=turns[3:])
    budget = one.prompt_tokens - bare.prompt_tokens + 5
    kept = build_prompt(
        tokenizer, "q?", [], max_prompt_tokens=10_000, history=turns, max_history_tokens=budget
    )
    assert kept.turns_used == 1 and "h3" in kept.text and "h2" not in kept.text
