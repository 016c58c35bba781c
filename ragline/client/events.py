"""Stream events as the client yields them, and the SSE parser that reads them."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragline.client.protocol import Error, Restart, Sources, StreamDone, Token

# What a client that gives up sends, by nginx's convention: an ``error`` event with it is a cancel.
CANCELLED_STATUS: Final = 499

# -- stream events ------------------------------------------------------------------------------


class _EventId(BaseModel):
    # Like the protocol's responses: a field a newer server adds is ignored.
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str | None = Field(default=None, description="The SSE id: what a reconnection resumes after.")


class SourcesEvent(Sources, _EventId):
    """The retrieved sources, first on every stream."""


class TokenEvent(Token, _EventId):
    """A piece of the answer."""


class RestartEvent(Restart, _EventId):
    """The answer starts again from its first token (a worker stopped mid-answer and another
    began it anew): drop the tokens received so far; only those after the last restart make up
    the ``done`` event's ``answer``."""


class DoneEvent(StreamDone, _EventId):
    """The end: every field of the JSON answer but ``sources`` (``answer``, ``timings``, …)."""


class ErrorEvent(Error, _EventId):
    """The request failed: ``status`` is HTTP-like (404 unknown index, 5xx failures)."""


class CancelledEvent(ErrorEvent):
    """The request was cancelled (on the wire an ``error`` with status 499)."""

    status: Literal[499] = CANCELLED_STATUS
    message: str = "cancelled"


StreamEvent = SourcesEvent | TokenEvent | RestartEvent | DoneEvent | ErrorEvent
_BY_NAME: dict[str, type[StreamEvent]] = {
    "sources": SourcesEvent,
    "token": TokenEvent,
    "restart": RestartEvent,
    "done": DoneEvent,
    "error": ErrorEvent,
}


def decode_event(name: str, data: str, event_id: str | None) -> StreamEvent | None:
    """One SSE event; None for an event type this client does not know (a newer server's)."""
    model = _BY_NAME.get(name)
    if model is None:
        return None
    event = model.model_validate_json(data).model_copy(update={"event_id": event_id})
    if isinstance(event, ErrorEvent) and event.status == CANCELLED_STATUS:
        return CancelledEvent(message=event.message, event_id=event_id)
    return event


class SSEParser:
    """Server-sent events from lines; an event is complete only at its blank line, so one cut
    short by a dropped connection is never yielded."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._id: str | None = None
        self._name = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str, str | None] | None:
        """``(event, data, id)`` when ``line`` ends an event, else None."""
        if not line:
            event = (self._name, "\n".join(self._data), self._id) if self._data else None
            self._reset()
            return event
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._name = value
        elif name == "data":
            self._data.append(value)
        return None  # a comment (":") or a field SSE does not define
