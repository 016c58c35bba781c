"""A request's trace context across the queues: in its task message's headers.

A task message carries the header ``ragline_trace``, ``{request_id: carrier}``: for each request
the task serves, the headers OpenTelemetry's propagators write for the span that sent it on (W3C
``traceparent`` and ``tracestate``, and baggage; ``OTEL_PROPAGATORS`` chooses). A mapping, since
a retrieval batch carries many requests, each in a trace of its own; a task of one request
carries one entry. In the headers, not the payload: the payload is the contract's typed model,
and a message without the header (sent where tracing is off, or by an older release) is served
as before.

The coalescer frames a batch in whichever request's turn flushes it, so each request's context
is taken when it enters the coalescer (:func:`remember`) and put in the batch's headers when the
batch is framed (:func:`batch_headers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ragline.broker.tracing.state import STATE

if TYPE_CHECKING:
    from opentelemetry.context import Context

TRACE_HEADER = "ragline_trace"
# The requests between the coalescer and their batch's message are a few batches' worth; a bound
# all the same, so that nothing a failed publish left behind can grow.
_PENDING_MAX = 10_000
_pending: dict[str, dict[str, str]] = {}


def carrier(context: Context | None = None) -> dict[str, str]:
    """The propagation headers of ``context`` (the current one by default); empty when it holds
    no span."""
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers, context=context)
    return headers


def remember(request_id: str) -> None:
    """Keep the current context as ``request_id``'s, for the batch that will carry it."""
    if STATE.tracer is None:
        return
    _pending[request_id] = carrier()
    if len(_pending) > _PENDING_MAX:
        del _pending[next(iter(_pending))]


def batch_headers(request_ids: Iterable[str]) -> dict[str, Any] | None:
    """The headers of a batch of these requests: the contexts :func:`remember` kept (and no
    longer keeps). None when it kept none of them."""
    if not _pending:
        return None
    carriers = {rid: found for rid in request_ids if (found := _pending.pop(rid, None))}
    return {TRACE_HEADER: carriers} if carriers else None


def task_headers(request_id: str, context: Context) -> dict[str, Any] | None:
    """The headers of a task of one request, sent on from ``context``."""
    found = carrier(context)
    return {TRACE_HEADER: {request_id: found}} if found else None


def carriers_of(headers: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """The carriers in a message's headers, by request id; anything malformed is left out (a
    header never fails a task)."""
    found = (headers or {}).get(TRACE_HEADER)
    if not isinstance(found, Mapping):
        return {}
    return {
        str(rid): {k: v for k, v in c.items() if isinstance(k, str) and isinstance(v, str)}
        for rid, c in found.items()
        if isinstance(c, Mapping)
    }


def context_of(headers: Mapping[str, str] | None) -> Context:
    """The context propagation ``headers`` carry; an empty one (a new trace) when they carry none."""
    from opentelemetry import propagate
    from opentelemetry.context import Context

    return propagate.extract(headers, context=Context()) if headers else Context()


def http_context(headers: Iterable[tuple[bytes, bytes]]) -> Context:
    """The context an HTTP caller sent (ASGI's raw headers): its trace goes on in ours."""
    wanted = (b"traceparent", b"tracestate", b"baggage")
    return context_of({k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in wanted})
