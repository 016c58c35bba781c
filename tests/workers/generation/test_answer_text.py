from __future__ import annotations

import pytest
from ragline.workers.generation.answer_text import AnswerText


@pytest.mark.parametrize(
    "deltas",
    [
        ["Hello", " world", "."],
        ["\n", "  Hello", " world", ".\n\n"],
        [" ", "\n"],
        ["A", " ", "\n", "B", "  "],
        ["  x  ", "  y  "],
        [],
    ],
)
def test_the_sent_parts_join_to_the_stripped_whole(deltas: list[str]) -> None:
    answer = AnswerText()
    sent = [answer.feed(d) for d in deltas]
    assert "".join(sent) == answer.text == "".join(deltas).strip()


def test_whitespace_between_words_waits_for_the_next_word() -> None:
    answer = AnswerText()
    assert [answer.feed(d) for d in ["Hi", " ", "\n", "there", "\n"]] == ["Hi", "", "", " \nthere", ""]
