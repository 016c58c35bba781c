"""An answer's ``[n]`` markers: renumbered as the answer streams, then mapped back to sources.

The prompt numbers its sources in an order of its own (for the prefix cache, workers/generation/
prompt.py), while a client has them in the order of the request's ``sources`` (best first) and
reads ``[n]`` as the n-th of those. :class:`MarkerRenumbering` rewrites each marker of the
model's text from the prompt's number to that one as the text streams, holding back a marker
still open at the end of a delta; :func:`citations` then maps the markers of the answer to its
sources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ragline.broker.contract.messages import Citation, Source

# "[2]", and each number of "[1, 3]" or "[1][3]".
_MARKERS = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
# The tail of a text that may still become a marker when more text comes.
_OPEN_MARKER = re.compile(r"\[[\d,\s]*\Z")
# A "[" followed by more than this is text, not a marker to wait for.
_MAX_OPEN = 32


class MarkerRenumbering:
    """Rewrites the markers of a streamed answer through ``mapping``; a number not in it (one the
    prompt did not give) is left as the model wrote it."""

    def __init__(self, mapping: Mapping[int, int]) -> None:
        self._mapping = dict(mapping)
        self._held = ""

    def _rewrite(self, text: str) -> str:
        def group(match: re.Match[str]) -> str:
            numbers = re.sub(r"\d+", lambda n: str(self._mapping.get(int(n[0]), n[0])), match[1])
            return f"[{numbers}]"

        return _MARKERS.sub(group, text)

    def feed(self, delta: str) -> str:
        """The rewritten text that can be sent now (a marker still open is held back)."""
        text = self._held + delta
        tail = _OPEN_MARKER.search(text)
        cut = tail.start() if tail is not None and len(text) - tail.start() <= _MAX_OPEN else len(text)
        self._held = text[cut:]
        return self._rewrite(text[:cut])

    def flush(self) -> str:
        """What is held back when the model stops: an unclosed "[" is plain text."""
        held, self._held = self._held, ""
        return held


def citations(answer: str, sources: Mapping[int, Source]) -> list[Citation]:
    """The sources an answer cites as ``[n]`` (``sources``: by number), in order of first
    citation; a number that names none of them is ignored."""
    cited: list[Citation] = []
    seen: set[int] = set()
    for group in _MARKERS.findall(answer):
        for marker in (int(n) for n in group.split(",")):
            if marker in seen or marker not in sources:
                continue
            seen.add(marker)
            s = sources[marker]
            cited.append(
                Citation(marker=marker, chunk_id=s.chunk_id, source=s.source, title=s.title, anchor=s.anchor)
            )
    return cited
