"""A Python client for ragline's HTTP API: :class:`Client` (sync) and :class:`AsyncClient` (asyncio).

::

    from ragline.client import Client, TokenEvent

    with Client("http://127.0.0.1:8000", api_key=key) as rl:
        answer = rl.query("What does the global statement do?", index="demo")
        print(answer.answer, [s.title for s in answer.sources])
        for event in rl.stream("What does the global statement do?", index="demo"):
            if isinstance(event, TokenEvent):
                print(event.text, end="", flush=True)
        job = rl.upload("demo", files=["guide.md"])  # waits for the new version
        print(job.result.version, [d.id for d in rl.documents("demo").documents])

A stream resumes by itself when its connection drops (or goes silent past the timeout): it
reconnects to ``GET /v1/query/stream/{request_id}`` with ``Last-Event-ID`` set to the last event
it received whole, so the events it yields have no gap and no repeat. For that it asks the server
to keep generating when the connection drops (``abort_on_disconnect: false``): an abandoned
stream runs to its end on the server.

HTTP errors raise :class:`APIError` subclasses carrying the server's ``error``, ``message``,
``request_id`` and ``Retry-After``. Refusals that say when to come back (429, 503) and failed
connections are retried ``retries`` times first; nothing is retried that could run twice
(a job is submitted with an ``Idempotency-Key``, so its retries return the same job).

Documents: :meth:`Client.upload` (files, or ``{id, text, metadata}`` documents),
:meth:`Client.documents`, :meth:`Client.delete_document` and :meth:`Client.delete_index` each
start a job on the server and wait for it (``wait=False``: return at once); a job that fails
raises :class:`JobFailed`.

Only HTTP, on httpx and pydantic (``pip install "ragline[client]"``): the results are typed
models mirroring the API's own, field for field (``protocol.py``); nothing of the server is
imported. The blocking client is in ``sync.py``, the asyncio one in ``aio.py``, what they share
in ``base.py``.
"""

from __future__ import annotations

from ragline.client.aio import AsyncClient
from ragline.client.base import DocumentIn, FileIn, JobOptions, QueryOptions
from ragline.client.errors import (
    APIError,
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    JobFailed,
    JobTimeout,
    NotFound,
    PayloadTooLarge,
    RaglineError,
    RateLimited,
    StreamInterrupted,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    api_error,
)
from ragline.client.events import (
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    RestartEvent,
    SourcesEvent,
    SSEParser,
    StreamEvent,
    TokenEvent,
    decode_event,
)
from ragline.client.protocol import (
    Citation,
    DocumentList,
    DocumentSummary,
    FailedDocument,
    IndexDetail,
    IndexList,
    IndexSummary,
    IngestProgress,
    IngestResult,
    JobAccepted,
    JobResult,
    JobView,
    QueryResponse,
    SemanticMatch,
    Source,
    Timings,
    Usage,
)
from ragline.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "BadRequest",
    "CancelledEvent",
    "Citation",
    "Client",
    "Conflict",
    "DocumentIn",
    "DocumentList",
    "DocumentSummary",
    "DoneEvent",
    "ErrorEvent",
    "FailedDocument",
    "FileIn",
    "Forbidden",
    "IndexDetail",
    "IndexList",
    "IndexSummary",
    "IngestProgress",
    "IngestResult",
    "InvalidRequest",
    "JobAccepted",
    "JobFailed",
    "JobOptions",
    "JobResult",
    "JobTimeout",
    "JobView",
    "NotFound",
    "PayloadTooLarge",
    "QueryOptions",
    "QueryResponse",
    "RaglineError",
    "RateLimited",
    "RestartEvent",
    "SSEParser",
    "SemanticMatch",
    "Source",
    "SourcesEvent",
    "StreamEvent",
    "StreamInterrupted",
    "Timings",
    "TokenEvent",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "Usage",
    "api_error",
    "decode_event",
]
