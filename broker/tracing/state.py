"""Whether this process traces, and its tracer: the one check every helper makes first."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer


class TracingState:
    """This process's tracer provider and tracer, or None while tracing is off."""

    __slots__ = ("provider", "tracer")

    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None


STATE = TracingState()


def tracer() -> Tracer | None:
    """The tracer, or None: tracing is off and nothing may create a span."""
    return STATE.tracer


def active() -> bool:
    return STATE.tracer is not None
