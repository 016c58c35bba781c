"""Tracing as a task hook (``workers/task_call.py``): each request a task serves goes on in its
own trace, from the context its message's headers carry (``broker/tracing/propagation.py``).

A task of one request (``ragline.generate``) is a span in that request's trace, current while
the body runs (the prefill and decode spans nest in it), after a span of the request's wait in
the queue. A batch (``ragline.retrieve``) serves many requests in one run: the batch is a span
of its own trace, current while the body runs (the embedding and the search nest in it), with a
link to each request it serves; each request gets a span in its own trace, linked to the batch,
and its next task is sent on from that span (:meth:`Traced.headers`).

Off (``broker/tracing``), the hook does nothing and keeps nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextvars import Token
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from ragline.broker import tracing
from ragline.broker.tracing import propagation
from ragline.workers.task_call import Hook, P, TaskCall, TaskCancelled, passes_through

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span


@dataclass(frozen=True, slots=True)
class Served:
    """A request a task serves: its id, and when it was put on the queue (Unix seconds)."""

    request_id: str
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class _Spans:
    by_request: dict[str, Span]  # request id -> its span
    current: Span  # the span the body runs in
    token: Token[Context]  # its context's, to detach


class Traced(Hook[P], Generic[P]):
    """Spans named ``name`` for the requests ``served`` gives, in their traces; with ``batch``,
    the run itself is a span of that name, linked to them and linked from them (one request or
    many); with ``queue_wait``, each request's wait in the queue is a span of that name."""

    def __init__(
        self,
        name: str,
        served: Callable[[TaskCall[P]], Sequence[Served]],
        *,
        batch: str | None = None,
        queue_wait: str | None = None,
    ) -> None:
        self.name = name
        self.served = served
        self.batch = batch
        self.queue_wait = queue_wait

    def before(self, call: TaskCall[P]) -> None:
        tracer = tracing.tracer()
        if tracer is None:
            return
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind

        served = self.served(call)
        if not served or (self.batch is None and len(served) > 1):
            return  # a task of one request serves one: nothing to trace otherwise
        carriers = propagation.carriers_of(call.headers)
        parents = {s.request_id: propagation.context_of(carriers.get(s.request_id)) for s in served}
        picked_ns = tracing.unix_ns(call.picked_at)
        attributes = {"celery.task_name": call.name, "messaging.message.id": call.task_id or ""}
        batch = None
        if self.batch is not None:
            sent_from = [trace.get_current_span(p).get_span_context() for p in parents.values()]
            batch = tracer.start_span(
                self.batch,
                context=context.Context(),  # a trace of its own, whichever requests it serves
                kind=SpanKind.CONSUMER,
                links=[Link(sc) for sc in sent_from if sc.is_valid],
                start_time=picked_ns,
                attributes={**attributes, "ragline.batch.size": len(served)},
            )
        by_request: dict[str, Span] = {}
        for s in served:
            parent = parents[s.request_id]
            if self.queue_wait is not None:
                tracing.record(self.queue_wait, tracing.unix_ns(s.enqueued_at), picked_ns, parent=parent)
            by_request[s.request_id] = tracer.start_span(
                self.name,
                context=parent,
                kind=SpanKind.CONSUMER,
                links=[Link(batch.get_span_context())] if batch is not None else (),
                start_time=picked_ns,
                attributes={**attributes, "ragline.request_id": s.request_id},
            )
        current = batch if batch is not None else by_request[served[0].request_id]
        token = context.attach(trace.set_span_in_context(current))
        call.put(self, _Spans(by_request, current, token))

    def after(self, call: TaskCall[P], error: BaseException | None) -> BaseException | None:
        if not call.has(self):
            return error
        from opentelemetry import context
        from opentelemetry.trace import StatusCode

        spans: _Spans = call.get(self)
        context.detach(spans.token)
        ended_ns = time.time_ns()
        # A cancel, a requeue or a retry is how the task ended, not a failure of it.
        failed = not (passes_through(error) or isinstance(error, TaskCancelled))
        for span in {id(s): s for s in (*spans.by_request.values(), spans.current)}.values():
            if failed and error is not None:
                span.record_exception(error)
                span.set_status(StatusCode.ERROR, str(error))
            elif error is not None:
                span.set_attribute("ragline.task.outcome", type(error).__name__)
            span.end(end_time=ended_ns)
        return error

    def headers(self, call: TaskCall[P], request_id: str) -> dict[str, Any] | None:
        """The headers of the next task of ``request_id``, sent on from its span here (None when
        nothing is traced)."""
        if not call.has(self):
            return None
        from opentelemetry import trace

        span = call.get(self).by_request.get(request_id)
        return None if span is None else propagation.task_headers(request_id, trace.set_span_in_context(span))


def generation_phases(
    started: float, first_token_ms: float | None, generation_ms: float, *, prompt_tokens: int, tokens: int
) -> None:
    """The engine's two phases of an answer begun at ``started`` (``time.perf_counter()``), in the
    current span (the generate task's): the prefill up to the first token, then the decode."""
    if not tracing.active():
        return
    began = tracing.perf_offset_ns() + tracing.unix_ns(started)
    first = began + tracing.unix_ns((generation_ms if first_token_ms is None else first_token_ms) / 1000)
    ended = began + tracing.unix_ns(generation_ms / 1000)
    tracing.record("ragline.generate.prefill", began, first, {"gen_ai.usage.input_tokens": prompt_tokens})
    tracing.record("ragline.generate.decode", first, ended, {"gen_ai.usage.output_tokens": tokens})
