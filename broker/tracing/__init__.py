"""OpenTelemetry traces: one per request, through the API, the queues and the workers.

Off unless ``settings.telemetry`` turns it on (``OTEL_EXPORTER_OTLP_ENDPOINT``, or
``RAGLINE_TRACING=otlp|console``): each process calls :func:`configure` when it starts and
:func:`shutdown` when it stops. Off, every helper returns at once, no span object is made and
OpenTelemetry's tracing SDK is not even imported.

A request's trace (docs/tracing.md): the API's server span, with the pipeline's steps in it
(``api/pipeline/steps.py``: the result cache, admission, the key's lease, the enqueue that waits
in the coalescer); the retrieval worker's span for the request, linked to the span of the batch
it was coalesced into (a trace of its own, with the embedding and the search, linked back to each
request); the generation queue's wait, the generation task, and in it the prefill up to the first
token and the decode. The context crosses each queue in the task's headers (:mod:`.propagation`).

Modules: :mod:`.state` (on or off, the tracer), :mod:`.setup` (the provider and its exporter),
:mod:`.spans` (step spans, spans of measured intervals), :mod:`.propagation` (task headers).
"""

from ragline.broker.tracing.setup import configure, install, shutdown
from ragline.broker.tracing.spans import perf_offset_ns, record, record_perf, traced, unix_ns
from ragline.broker.tracing.state import active, tracer

__all__ = [
    "active",
    "configure",
    "install",
    "perf_offset_ns",
    "record",
    "record_perf",
    "shutdown",
    "traced",
    "tracer",
    "unix_ns",
]
