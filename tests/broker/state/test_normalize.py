"""Cache-key normalisation: the equalities users expect, and none of the false ones."""

from __future__ import annotations

import pytest
from ragline.broker.state.normalize import normalize_query, query_digest


@pytest.mark.parametrize(
    "variants",
    [
        ("RAG系统", "RAG 系统", "the RAG 系统?", "  rag   系统  "),
        ("What is the GIL?", "what is GIL", "What   is the  GIL", "WHAT IS THE GIL ?!"),
        ("ｆｕｌｌｗｉｄｔｈ text", "fullwidth text"),  # NFKC
        ("Straße", "STRASSE"),  # case folding
        ("How do I read a file?", "how do i read file"),
        ("Python的GIL是什么", "python 的 gil 是什么"),
        ("«Quoted» question.", "quoted question"),
    ],
)
def test_share_a_key(variants: tuple[str, ...]) -> None:
    assert len({normalize_query(v) for v in variants}) == 1
    assert len({query_digest(v, "idx", "v1", 5, "rag") for v in variants}) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("not X", "X"),
        ("is it not thread safe", "is it thread safe"),
        ("How do I sort a list?", "Why do I sort a list?"),
        ("flights to Paris", "flights from Paris"),
        ("C++", "C"),
        ("C#", "C"),
        ("python 3.11", "python 3.12"),
        ("can I delete it", "must I delete it"),
        ("cats and dogs", "cats or dogs"),
        ("RAG系统", "RAG系"),
    ],
)
def test_keep_apart(a: str, b: str) -> None:
    assert normalize_query(a) != normalize_query(b)


def test_digest_carries_index_version_top_k_and_mode() -> None:
    base = query_digest("q", "idx", "v1", 5, "rag")
    assert base != query_digest("q", "idx", "v2", 5, "rag")
    assert base != query_digest("q", "other", "v1", 5, "rag")
    assert base != query_digest("q", "idx", "v1", 6, "rag")
    assert base != query_digest("q", "idx", "v1", 5, "retrieval")
