"""reST roles read as their text, by a scan that does what the former regex did."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.workers.retrieval.readers.roles import strip_roles


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        (":func:`~os.chmod` changes modes", "os.chmod changes modes"),
        (":ref:`the tutorial <tut-lists>` and :py:class:`!int`", "the tutorial and int"),
        (":c:func:`PyList_New` :keyword:`global`", "PyList_New global"),
        ("a::`not a role` and :role:`unclosed", "a::`not a role` and :role:`unclosed"),
        (":ref:`text <target` stays", ":ref:`text <target` stays"),
    ],
)
def test_roles_read_as_their_text(text: str, plain: str) -> None:
    assert strip_roles(text) == plain


# The regex this replaced (quadratic in a run of name characters or of spaces): on short text,
# the reference for what a role is and what it reads as.
_FORMER_ROLE = re.compile(r":[\w:+-]+:`~?!?([^`<]*?)(?:\s*<[^`]*>)?`")

_PIECES = [":", "`", "a", "_", "+", "-", "~", "!", "<", ">", " ", "\t", "é", "\u3000", ":a:`", "x <y>`"]
_role_like = st.lists(st.sampled_from(_PIECES), max_size=16).map("".join)


@settings(max_examples=500, deadline=None, database=None)
@given(_role_like | st.text(max_size=24))
def test_strip_roles_reads_as_the_former_regex(text: str) -> None:
    assert strip_roles(text) == _FORMER_ROLE.sub(r"\1", text)
