"""The answer's text as it streams: what the tokens join to is exactly ``done.answer``.

The answer is the generated text without the whitespace a model puts before and after it. The
whitespace is taken off the stream too, not only off the final answer: a client that joins the
token events (and the fault suite's check) must get ``done.answer``, byte for byte. Leading
whitespace is dropped as it comes; trailing whitespace is held back until text follows it, so
whatever is held when the engine stops is what the strip drops.
"""

from __future__ import annotations


class AnswerText:
    def __init__(self) -> None:
        self._parts: list[str] = []
        self._held = ""  # whitespace after the last text sent, sent once more text follows

    def feed(self, delta: str) -> str:
        """The part of ``delta`` to send now (may be empty)."""
        if not self._parts:
            delta = delta.lstrip()
        body = delta.rstrip()
        if not body:
            if self._parts:
                self._held += delta
            return ""
        out = self._held + body
        self._held = delta[len(body) :]
        self._parts.append(out)
        return out

    @property
    def text(self) -> str:
        """What was sent so far, joined: the answer once the engine has stopped."""
        return "".join(self._parts)
