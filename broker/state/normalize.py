"""Normalised query keys: different spellings of one question share a cache entry.

Conservative on purpose: a false hit serves a wrong answer (the top complaint about semantic
caches), a false miss only costs a computation. So negations, interrogatives, modals and
prepositions are kept ("not X" ≠ "X", "how" ≠ "why", "to" ≠ "from"), and only sentence-edge
punctuation is trimmed (so "C++" keeps its pluses).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# Words that change no question's meaning; deliberately short (see the module docstring).
STOP_WORDS = frozenset(
    {
        "a",
        "an",
        "the",
        "is",
        "are",
        "am",
        "was",
        "were",
        "be",
        "been",
        "being",
        "do",
        "does",
        "did",
        "please",
        "i",
        "me",
        "my",
        "you",
        "your",
        "we",
        "us",
        "our",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "of",
    }
)

_CJK = (
    r"\u3040-\u30ff"  # hiragana, katakana
    r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    r"\uac00-\ud7af"  # hangul
)
_CJK_THEN_LATIN = re.compile(rf"([{_CJK}])(?=[^\s{_CJK}])")
_LATIN_THEN_CJK = re.compile(rf"([^\s{_CJK}])(?=[{_CJK}])")
_EDGE = " \t\n\r.,!?;:'\"()[]{}<>«»“”‘’。，！？；：、（）【】「」『』…-"


def normalize_query(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _CJK_THEN_LATIN.sub(r"\1 ", text)
    text = _LATIN_THEN_CJK.sub(r"\1 ", text)
    words = [w for w in (word.strip(_EDGE) for word in text.split()) if w and w not in STOP_WORDS]
    return " ".join(words)


def query_digest(query: str, *parts: object) -> str:
    """A stable digest of the normalised query and everything else the answer depends on."""
    material = "\x1f".join([normalize_query(query), *(str(p) for p in parts)])
    return hashlib.sha256(material.encode()).hexdigest()[:40]
