"""An answer's markers: rewritten to the client's numbering as they stream, mapped back to sources."""

from __future__ import annotations

import pytest
from ragline.broker.contract.messages import Source
from ragline.workers.generation.citations import MarkerRenumbering, citations

# The prompt's [1] is the client's [3], and so on.
MAPPING = {1: 3, 2: 1, 3: 2}


def renumbered(deltas: list[str], mapping: dict[int, int] = MAPPING) -> str:
    markers = MarkerRenumbering(mapping)
    return "".join(markers.feed(d) for d in deltas) + markers.flush()


def test_each_marker_and_each_number_of_a_group_is_rewritten() -> None:
    text = "It is so [1], see [2, 3] and [3][1]; [12] and [0] name no source."
    assert renumbered([text]) == "It is so [3], see [1, 2] and [2][3]; [12] and [0] name no source."


@pytest.mark.parametrize("text", ["As [1] says, and [2, 3] too.", "[1]", "a [2,3] b [1]"])
def test_a_marker_split_anywhere_between_deltas_is_rewritten_whole(text: str) -> None:
    whole = renumbered([text])
    for cut in range(len(text) + 1):
        assert renumbered([text[:cut], text[cut:]]) == whole, cut
    assert renumbered(list(text)) == whole  # one character per delta


def test_what_could_still_become_a_marker_is_held_back_and_nothing_else() -> None:
    markers = MarkerRenumbering(MAPPING)
    assert markers.feed("See [") == "See "
    assert markers.feed("1") == ""
    assert markers.feed("] now") == "[3] now"
    assert markers.feed("[a list]") == "[a list]"
    assert markers.feed("x [2") == "x "
    assert markers.flush() == "[2"  # the model stopped mid-marker: the text as it was


def test_a_long_bracket_is_text_not_a_marker_to_wait_for() -> None:
    markers = MarkerRenumbering(MAPPING)
    long_open = "[" + "1, " * 20
    assert markers.feed(long_open) == long_open


def test_citations_map_markers_to_their_sources_in_order_of_first_citation() -> None:
    sources = {
        n: Source(chunk_id=f"c{n}", source=f"s{n}", title=f"t{n}", text="x", score=0.5, anchor=f"a{n}")
        for n in (1, 2, 3)
    }
    cited = citations("It is w1 [2], see also [3][2] and [1, 9] but not [0] or [4].", sources)
    assert [(c.marker, c.chunk_id, c.title, c.anchor) for c in cited] == [
        (2, "c2", "t2", "a2"),
        (3, "c3", "t3", "a3"),
        (1, "c1", "t1", "a1"),
    ]
    assert citations("No marker here.", sources) == []
