"""Front matter: Markdown's ``---`` block and a reST field list at the top, bounded in size."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.workers.retrieval.readers.front_matter import MAX_FRONT_MATTER_CHARS, split_front_matter

from tests.workers.retrieval.readers.timing import SCALE, assert_linear_time


def test_markdown_front_matter_is_read_and_removed() -> None:
    # Nested YAML is not read: an indented line is no field.
    text = '---\ntitle: "Quoted"\nTags : a, b  \nempty:\n  nested: no\n---\n# Body\n'
    assert split_front_matter(text, ".md") == ({"title": "Quoted", "tags": "a, b"}, "# Body\n")


def test_rest_field_list_is_read_and_removed() -> None:
    assert split_front_matter(":tocdepth: 2\n:Author:  Me \n\nText\n", ".rst") == (
        {"tocdepth": "2", "author": "Me"},
        "\nText\n",
    )


def test_rest_title_with_a_role_is_not_a_field_list() -> None:
    text = ":mod:`os` module\n================\n"
    assert split_front_matter(text, ".rst") == ({}, text)


def test_other_kinds_have_none() -> None:
    assert split_front_matter("---\nkey: value\n---\n", ".txt") == ({}, "---\nkey: value\n---\n")


@pytest.mark.parametrize(
    ("kind", "field", "close"),
    [(".md", "key: value\n", "---\n"), (".rst", ":key: value\n", "\n")],
)
def test_front_matter_that_has_not_ended_within_the_bound_is_text(kind: str, field: str, close: str) -> None:
    opening = "---\n" if kind == ".md" else ""
    within = opening + field * ((MAX_FRONT_MATTER_CHARS - 100) // len(field)) + close + "Body\n"
    assert split_front_matter(within, kind)[0] == {"key": "value"}
    past = opening + field * (MAX_FRONT_MATTER_CHARS // len(field) + 1) + close + "Body\n"
    assert split_front_matter(past, kind) == ({}, past)


@pytest.mark.parametrize("kind", [".md", ".rst"])
def test_a_value_of_spaces_reads_in_linear_time(kind: str) -> None:
    # Within the bound, so that the field is read both times: a value with spaces inside.
    def front_matter(size: int) -> str:
        field = ("key: a{}b\n" if kind == ".md" else ":key: a{}b\n").format(" " * (size - 20))
        return f"---\n{field}---\nBody\n" if kind == ".md" else f"{field}\nBody\n"

    large_size = MAX_FRONT_MATTER_CHARS - 100
    small, large = front_matter(large_size // SCALE), front_matter(large_size)
    assert split_front_matter(large, kind)[0]["key"].endswith(" b")
    assert_linear_time(lambda: split_front_matter(small, kind), lambda: split_front_matter(large, kind))


def test_markdown_front_matter_without_its_end_is_text() -> None:
    text = "---\nkey: value\n\n# Title\n"
    assert split_front_matter(text, ".md") == ({}, text)


# The field regex Markdown front matter used before (quadratic in a value's inner spaces): on short
# lines, the reference for what a field is.
_FORMER_FIELD = re.compile(r"^([\w-]+)\s*:\s*(.*?)\s*$")

_field_like = st.text(st.sampled_from([" ", "\t", ":", "a", "-", "'", "\r", "\x0b", "\u3000"]), max_size=14)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_field_like | st.text(max_size=16).map(lambda s: s.replace("\n", "")), max_size=4))
def test_markdown_fields_read_as_the_former_regex(lines: list[str]) -> None:
    # No line may end the block early: what is read and what is expected are the same lines.
    lines = [line.replace("---", "") for line in lines]
    expected = {}
    for line in lines:
        m = _FORMER_FIELD.match(line)
        if m and m.group(2):
            expected[m.group(1).lower()] = m.group(2).strip("\"'")
    text = "---\n" + "".join(line + "\n" for line in lines) + "---\nBody"
    assert split_front_matter(text, ".md")[0] == expected
