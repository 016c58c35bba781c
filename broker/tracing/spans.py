"""Spans around steps, and spans of what was already measured.

Every helper checks whether tracing is on first and returns at once when it is off: no span
object is made and nothing of OpenTelemetry is called.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ragline.broker.tracing.state import STATE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.util.types import AttributeValue

P = ParamSpec("P")
T = TypeVar("T")
Attributes = Mapping[str, "AttributeValue"]
# What a step's span says of it, from the step's arguments, once it has run.
Describe = Callable[..., Attributes]
Step = Callable[P, Awaitable[T]]


def traced(name: str, describe: Describe | None = None) -> Callable[[Step[P, T]], Step[P, T]]:
    """An async step in a span ``name``, current while it runs (what it calls nests in it);
    ``describe`` is called with the step's arguments once it has returned or raised, and gives
    the span's attributes. An exception is recorded on the span and goes on."""

    def decorate(step: Step[P, T]) -> Step[P, T]:
        @functools.wraps(step)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            tracer = STATE.tracer
            if tracer is None:
                return await step(*args, **kwargs)
            with tracer.start_as_current_span(name) as span:
                try:
                    return await step(*args, **kwargs)
                finally:
                    if describe is not None:
                        span.set_attributes(describe(*args, **kwargs))

        return run

    return decorate


def record(
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: Attributes | None = None,
    *,
    parent: Context | None = None,
) -> None:
    """A span of something that already happened, from ``start_ns`` to ``end_ns`` (Unix
    nanoseconds), a child of ``parent`` (by default the current span)."""
    tracer = STATE.tracer
    if tracer is None:
        return
    span = tracer.start_span(name, context=parent, attributes=attributes, start_time=start_ns)
    span.end(end_time=max(start_ns, end_ns))


def record_perf(name: str, started: float, ended: float, attributes: Attributes | None = None) -> None:
    """:func:`record` of an interval measured on ``time.perf_counter()``, as a child of the
    current span."""
    if STATE.tracer is None:
        return
    offset_ns = perf_offset_ns()
    record(name, offset_ns + unix_ns(started), offset_ns + unix_ns(ended), attributes)


def perf_offset_ns() -> int:
    """Nanoseconds from ``time.perf_counter()``'s origin to the Unix epoch's, as the clocks read
    now: a perf_counter time in ns plus this is a Unix time in ns."""
    return time.time_ns() - time.perf_counter_ns()


def unix_ns(seconds: float) -> int:
    """Seconds (Unix, or perf_counter) as the integer nanoseconds spans take."""
    return int(seconds * 1e9)
