"""Prompts: fixed prefix, canonical source order, lowest-scored sources dropped to fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.broker.contract.messages import ChatTurn, Source
from ragline.workers.generation.prompt import SYSTEM_PROMPT, build_prompt


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


def test_the_best_source_comes_first_then_the_others_by_chunk_id(tokenizer) -> None:
    # Given best first, as retrieval sends them: c02, then c00, then c01.
    given = [_sources(3)[i] for i in (2, 0, 1)]
    given = [s.model_copy(update={"score": 1 - i / 10}) for i, s in enumerate(given)]
    built = build_prompt(tokenizer, "q?", given, max_prompt_tokens=2000)
    assert [s.chunk_id for s in built.numbered] == ["c02", "c00", "c01"]
    assert "[1] t2\n" in built.text and "[3] t1\n" in built.text
    assert built.given_numbers == (1, 2, 3)
    # Retrieval's order is not always the scores' (a reranked head, say): each source keeps the
    # number a client knows it by.
    shuffled = [given[i] for i in (1, 2, 0)]
    built = build_prompt(tokenizer, "q?", shuffled, max_prompt_tokens=2000)
    assert [s.chunk_id for s in built.numbered] == ["c02", "c00", "c01"]
    assert built.given_numbers == (3, 1, 2) and built.renumbering == {1: 3, 2: 1, 3: 2}
    assert {n: s.chunk_id for n, s in built.by_given_number.items()} == {1: "c00", 2: "c01", 3: "c02"}


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


# -- the layout for the prefix cache -----------------------------------------------------------


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("block", [16, 128])
@pytest.mark.parametrize("n_turns", [0, 1, 2])
def test_the_head_fills_whole_blocks_and_is_the_same_whatever_varies(
    tokenizer, block: int, n_turns: int
) -> None:
    one = build_prompt(
        tokenizer, "q?", _sources(3), max_prompt_tokens=10_000, history=_turns(n_turns), block_tokens=block
    )
    other_turns = [t.model_copy(update={"content": "other " + t.content}) for t in _turns(n_turns)]
    other = build_prompt(
        tokenizer,
        "Another?",
        _sources(2, words=5),
        max_prompt_tokens=10_000,
        history=other_turns,
        block_tokens=block,
    )
    assert one.head_tokens % block == 0 and one.head_tokens == other.head_tokens
    assert one.token_ids[: one.head_tokens] == other.token_ids[: other.head_tokens]
    head = tokenizer.decode(one.token_ids[: one.head_tokens])
    assert SYSTEM_PROMPT in head and "w0" not in head and "h0" not in head
    # What follows the head is the first content that varies: a turn, or the sources.
    rest = tokenizer.decode(one.token_ids[one.head_tokens :])
    assert rest.startswith("h0" if n_turns else "Context:\n[1] t0")


def test_no_padding_when_blocks_are_one_token(tokenizer) -> None:
    padded = build_prompt(tokenizer, "q?", _sources(2), max_prompt_tokens=10_000, block_tokens=128)
    plain = build_prompt(tokenizer, "q?", _sources(2), max_prompt_tokens=10_000)
    assert plain.prompt_tokens == padded.prompt_tokens - (padded.head_tokens - plain.head_tokens)
    assert plain.head_tokens < 128 and padded.head_tokens == 128


def test_without_special_text_the_ids_are_the_whole_text_s_tokens(tokenizer) -> None:
    """Tokenizing the pieces apart changes nothing for ordinary text (nor, so, the answers)."""
    sources = [
        Source(
            chunk_id=f"c{i}",
            source="s",
            title=f"Simple statements › part {i}",
            text=f"Some text, (with) punctuation: {i}.\n\nA second paragraph, with `code` and numbers 12.5.",
            score=1 - i / 10,
        )
        for i in range(3)
    ]
    for turns in ([], _turns(2)):
        built = build_prompt(
            tokenizer, "What is it, exactly?", sources, max_prompt_tokens=10_000, history=turns
        )
        assert list(built.token_ids) == tokenizer(built.text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("block", [16, 128])
def test_the_same_sources_in_another_score_order_give_the_same_tokens_up_to_the_question(
    tokenizer, block: int
) -> None:
    sources = _sources(5)
    # The same best (c00); the others' ranks reversed.
    rescored = [
        sources[0],
        *(s.model_copy(update={"score": 0.2 + i / 10}) for i, s in enumerate(sources[1:])),
    ]
    a = build_prompt(tokenizer, "First question?", sources, max_prompt_tokens=10_000, block_tokens=block)
    b = build_prompt(
        tokenizer, "A second one?", list(reversed(rescored)), max_prompt_tokens=10_000, block_tokens=block
    )
    shared = _common_prefix(a.token_ids, b.token_ids)
    assert "[5] t4\n" + sources[4].text in tokenizer.decode(a.token_ids[:shared])
    assert shared // block > a.head_tokens // block  # blocks of sources, past the head's, are shared
    order = ["c00", "c01", "c02", "c03", "c04"]
    assert [s.chunk_id for s in a.numbered] == [s.chunk_id for s in b.numbered] == order
    # The clients' numbers follow the order given.
    assert a.given_numbers == (1, 2, 3, 4, 5) and b.given_numbers == (5, 4, 3, 2, 1)


@pytest.mark.parametrize("block", [16, 128])
def test_another_best_source_shares_the_head(tokenizer, block: int) -> None:
    sources = _sources(3)
    a = build_prompt(tokenizer, "q?", sources, max_prompt_tokens=10_000, block_tokens=block)
    best_last = [s.model_copy(update={"score": 1 - s.score}) for s in sources]
    b = build_prompt(tokenizer, "q?", best_last, max_prompt_tokens=10_000, block_tokens=block)
    assert [s.chunk_id for s in b.numbered] == ["c02", "c00", "c01"]
    assert _common_prefix(a.token_ids, b.token_ids) >= a.head_tokens == b.head_tokens
