"""A Python client for ragline's HTTP API: :class:`Client` (sync) and :class:`AsyncClient` (asyncio).

::

    from ragline.client import Client, TokenEvent

    with Client("http://127.0.0.1:8000", api_key=key) as rl:
        answer = rl.query("What does the global statement do?", index="demo")
        print(answer.answer, [s.title for s in answer.sources])
        for event in rl.stream("What does the global statement do?", index="demo"):
            if isinstance(event, TokenEvent):
                print(event.text, end="", flush=True)

A stream resumes by itself when its connection drops (or goes silent past the timeout): it
reconnects to ``GET /v1/query/stream/{request_id}`` with ``Last-Event-ID`` set to the last event
it received whole, so the events it yields have no gap and no repeat. For that it asks the server
to keep generating when the connection drops (``abort_on_disconnect: false``): an abandoned
stream runs to its end on the server.

HTTP errors raise :class:`APIError` subclasses carrying the server's ``error``, ``message``,
``request_id`` and ``Retry-After``. Refusals that say when to come back (429, 503) and failed
connections are retried ``retries`` times first; nothing is retried that could run twice
(a job is submitted with an ``Idempotency-Key``, so its retries return the same job).

Only HTTP: the results are the API's own response models (pydantic, without FastAPI).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field

from api.indexes_protocol import IndexDetail, IndexList, IndexSummary
from api.jobs_protocol import JobAccepted, JobRequest, JobView
from api.protocol import QueryRequest, QueryResponse, Source, StreamDone, Timings, Usage
from broker.contract import CANCELLED_STATUS, Error, Sources, Token

__all__ = [
    "APIError",
    "AsyncClient",
    "BadRequest",
    "CancelledEvent",
    "Client",
    "Conflict",
    "DoneEvent",
    "ErrorEvent",
    "IndexDetail",
    "IndexList",
    "IndexSummary",
    "InvalidRequest",
    "JobAccepted",
    "JobTimeout",
    "JobView",
    "NotFound",
    "PayloadTooLarge",
    "QueryResponse",
    "RaglineError",
    "RateLimited",
    "Source",
    "SourcesEvent",
    "StreamEvent",
    "StreamInterrupted",
    "Timings",
    "TokenEvent",
    "Unauthorized",
    "Unavailable",
    "Usage",
]

DEFAULT_URL = "http://127.0.0.1:8000"
FINAL_JOB_STATUSES = frozenset({"done", "failed", "cancelled"})
# A refusal asking for a longer wait than this is raised at once rather than slept on.
_MAX_RETRY_AFTER_S = 30.0
_BACKOFF_S = 0.25
_BACKOFF_MAX_S = 8.0


# -- errors -------------------------------------------------------------------------------------


class RaglineError(Exception):
    """Anything this client raises on purpose."""


class APIError(RaglineError):
    """The server answered with an error status: ``{error, message, request_id}``."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after  # seconds, from the Retry-After header


class BadRequest(APIError):
    """400: malformed JSON, an empty or too long query, a value out of range."""


class InvalidRequest(BadRequest):
    """422: the body or a parameter does not have the expected shape."""


class Unauthorized(APIError):
    """401: no API key, or one that is unknown or revoked."""


class NotFound(APIError):
    """404: an unknown index, job or stream."""


class Conflict(APIError):
    """409: e.g. cancelling a job that has finished."""


class PayloadTooLarge(APIError):
    """413: the body is over the server's limit."""


class RateLimited(APIError):
    """429: over the key's or the server's rate limit; ``retry_after`` says when to come back."""


class Unavailable(APIError):
    """503: the server cannot take the request now (load, or a part down); see ``retry_after``."""


_ERRORS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


class StreamInterrupted(RaglineError):
    """A stream's connection dropped and every reconnection failed. ``resume(request_id,
    last_event_id)`` later picks it up where it stopped, while the server keeps its events."""

    def __init__(self, message: str, *, request_id: str | None, last_event_id: str | None) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.last_event_id = last_event_id


class JobTimeout(RaglineError, TimeoutError):
    """``wait_job`` gave up before the job finished; ``job`` is its last state seen."""

    def __init__(self, job: JobView, timeout_s: float) -> None:
        super().__init__(f"job {job.job_id} still {job.status} after {timeout_s:g} s")
        self.job = job


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ragline sends seconds


def api_error(response: httpx.Response) -> APIError:
    """The exception for an error response (its body read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"message": response.text[:500] or response.reason_phrase}
    return _ERRORS.get(response.status_code, APIError)(
        response.status_code,
        str(body.get("error") or "http_error"),
        str(body.get("message") or response.reason_phrase),
        request_id=body.get("request_id") or response.headers.get("x-request-id"),
        retry_after=_retry_after(response.headers.get("retry-after")),
    )


# -- stream events ------------------------------------------------------------------------------


class _EventId(BaseModel):
    # Last among an event's bases, so its config wins: a field a newer server adds is ignored.
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str | None = Field(default=None, description="The SSE id: what a reconnection resumes after.")


class SourcesEvent(Sources, _EventId):
    """The retrieved sources, first on every stream."""


class TokenEvent(Token, _EventId):
    """A piece of the answer."""


class DoneEvent(StreamDone, _EventId):
    """The end: every field of the JSON answer but ``sources`` (``answer``, ``timings``, …)."""


class ErrorEvent(Error, _EventId):
    """The request failed: ``status`` is HTTP-like (404 unknown index, 5xx failures)."""


class CancelledEvent(ErrorEvent):
    """The request was cancelled (on the wire an ``error`` with status 499)."""

    status: Literal[499] = CANCELLED_STATUS
    message: str = "cancelled"


StreamEvent = SourcesEvent | TokenEvent | DoneEvent | ErrorEvent
_BY_NAME: dict[str, type[SourcesEvent | TokenEvent | DoneEvent | ErrorEvent]] = {
    "sources": SourcesEvent,
    "token": TokenEvent,
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


# -- what both clients share: requests, retries, a stream's cursor ---------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class QueryOptions(TypedDict, total=False):
    """A query's options (``QueryRequest``'s fields); the server's defaults for those not given."""

    index: str  # the index to ask; the server's default index when not given
    top_k: int  # how many sources (1..50)
    mode: Literal["rag", "retrieval"]  # "retrieval": the sources only, no answer generated
    allow_degraded: bool  # when generation is too busy: sources only (True) or 503 (False)
    allow_early_exit: bool  # let the best source answer when it clears RAGLINE_EARLY_EXIT_SCORE
    ef_search: int  # HNSW search effort
    nprobe: int  # IVF lists probed


class JobOptions(QueryOptions, total=False):
    webhook_url: str  # receives the finished job, signed (docs/webhooks.md)
    metadata: dict[str, Any]  # echoed back in the job and its webhook


def _path(template: str, *parts: str) -> str:
    """``template`` with each ``{}`` filled by one quoted path segment (an id cannot escape it)."""
    return template.format(*(quote(part, safe="") for part in parts))


def _query_call(path: str, body: QueryRequest, deadline_ms: int | None) -> _Call:
    headers = {"X-Request-Deadline-Ms": str(deadline_ms)} if deadline_ms is not None else {}
    return _Call("POST", path, body.model_dump(mode="json", exclude_unset=True), headers)


def _query_body(model: type[QueryRequest], query: str, options: QueryOptions | dict[str, Any]) -> Any:
    # Only what the caller set travels, so the server's defaults apply to the rest. An unknown
    # option fails here, as the server would refuse it.
    return model(query=query, **{k: v for k, v in options.items() if v is not None})


class _Retries:
    """When to try a call again: a failed connection, or a 429/503 that says when."""

    def __init__(self, retries: int) -> None:
        self._left = retries
        self._failures = 0

    def after_error(self, exc: APIError) -> float:
        """Seconds to wait before the next try; re-raises ``exc`` when there is none."""
        if exc.status not in (429, 503) or exc.retry_after is None or exc.retry_after > _MAX_RETRY_AFTER_S:
            raise exc
        return self._spend(exc, exc.retry_after)

    def after_failure(self, exc: Exception) -> float:
        self._failures += 1
        return self._spend(exc, min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (self._failures - 1)))

    def _spend(self, exc: Exception, wait_s: float) -> float:
        if self._left <= 0:
            raise exc
        self._left -= 1
        return wait_s


class _StreamCursor:
    """Where a stream is: its request id and the last event received whole. On a drop it says
    how to reconnect; after ``retries`` reconnections in a row without a new event it gives up."""

    def __init__(self, first: _Call | None, retries: int, *, request_id: str | None = None) -> None:
        self._first = first
        self._retries = retries
        self._drops = 0
        self.request_id = request_id
        self.last_event_id: str | None = None
        self.finished = False
        self._parser = SSEParser()

    def call(self) -> _Call:
        if self.request_id is None and self._first is not None:
            # Nothing came back yet, not even the request id: ask again.
            return self._first
        headers = {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}
        return _Call("GET", _path("/v1/query/stream/{}", self.request_id), headers=headers)

    def opened(self, response: httpx.Response) -> None:
        self.request_id = self.request_id or response.headers.get("x-request-id")
        self._parser = SSEParser()  # a partial event of the dropped connection is discarded

    def feed(self, line: str) -> StreamEvent | None:
        parsed = self._parser.feed(line)
        if parsed is None:
            return None
        name, data, event_id = parsed
        if event_id:
            self.last_event_id = event_id
            self._drops = 0
        event = decode_event(name, data, event_id)
        if isinstance(event, DoneEvent | ErrorEvent):
            self.finished = True
        return event

    def dropped(self, exc: Exception | None) -> float:
        """Seconds to wait before reconnecting; raises StreamInterrupted past the retries."""
        self._drops += 1
        if self._drops > self._retries:
            why = f": {exc!r}" if exc else " before its last event"
            raise StreamInterrupted(
                f"the stream dropped {self._drops} times in a row{why}",
                request_id=self.request_id,
                last_event_id=self.last_event_id,
            ) from exc
        # At once the first time (a blip), then backing off.
        return 0.0 if self._drops == 1 else min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (self._drops - 2))


_M = TypeVar("_M", bound=BaseModel)


class _Base:
    _http_class: ClassVar[type[httpx.Client] | type[httpx.AsyncClient]]
    _job_poll_s: ClassVar[float] = 0.5

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 200.0,
        retries: int = 3,
    ) -> None:
        """
        :param base_url: the API's address, e.g. ``http://127.0.0.1:8000``.
        :param api_key: sent as ``Authorization: Bearer <key>`` (``ragline keys create``); None
            for an API that runs without keys.
        :param timeout: seconds to wait for a connection, a response, and between two events of
            a stream (a stream silent that long reconnects). Above the server's own request
            timeout (180 s by default), so the server's answer, even a timeout, comes first.
        :param retries: how many times a call is tried again after a failed connection or a
            429/503 that says when to come back (``Retry-After`` up to 30 s), and how many
            reconnections in a row, without a new event, a dropped stream makes before raising
            StreamInterrupted.
        """
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        headers = {"User-Agent": "ragline-client/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = self._http_class(base_url=self.base_url, headers=headers, timeout=self.timeout)

    @staticmethod
    def _decode(model: type[_M], response: httpx.Response) -> _M:
        return model.model_validate_json(response.content)

    @staticmethod
    def _job_call(
        query: str, idempotency_key: str | None, deadline_ms: int | None, options: JobOptions
    ) -> _Call:
        call = _query_call("/v1/jobs", _query_body(JobRequest, query, options), deadline_ms)
        # Always keyed: a retry after a lost response returns the same job instead of a second one.
        call.headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex
        return call

    def _stream_cursor(
        self, query: str, deadline_ms: int | None, resume: bool, options: QueryOptions
    ) -> _StreamCursor:
        # Resuming needs the server to go on generating while the connection is down.
        body = _query_body(QueryRequest, query, {**options, "abort_on_disconnect": not resume})
        first = _query_call("/v1/query/stream", body, deadline_ms)
        return _StreamCursor(first, self.retries if resume else 0)

    def _resume_cursor(self, request_id: str, last_event_id: str | None) -> _StreamCursor:
        cursor = _StreamCursor(None, self.retries, request_id=request_id)
        cursor.last_event_id = last_event_id
        return cursor


# -- the sync client ------------------------------------------------------------------------------


class Client(_Base):
    """ragline over HTTP, blocking (httpx). Use it as a context manager, or call :meth:`close`.
    Options (``Client(base_url, api_key=, timeout=, retries=)``): see :meth:`_Base.__init__`."""

    _http_class = httpx.Client
    _http: httpx.Client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> httpx.Response:
        retries = _Retries(self.retries)
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.body, headers=call.headers)
            except httpx.TransportError as exc:
                time.sleep(retries.after_failure(exc))
                continue
            if response.is_success:
                return response
            time.sleep(retries.after_error(api_error(response)))

    def query(
        self,
        query: str,
        *,
        deadline_ms: int | None = None,
        **options: Unpack[QueryOptions],
    ) -> QueryResponse:
        """Ask and wait for the whole answer (``POST /v1/query``). Unset options take the server's
        defaults: the default index, its ``top_k``, ``mode="rag"``, degraded answers allowed."""
        call = _query_call("/v1/query", _query_body(QueryRequest, query, options), deadline_ms)
        return self._decode(QueryResponse, self._send(call))

    def stream(
        self,
        query: str,
        *,
        deadline_ms: int | None = None,
        resume: bool = True,
        **options: Unpack[QueryOptions],
    ) -> Iterator[StreamEvent]:
        """Ask and yield the answer as it comes (``POST /v1/query/stream``): a SourcesEvent, then
        TokenEvents, then a DoneEvent, or an ErrorEvent (a CancelledEvent when cancelled), after
        which it stops. With ``resume`` (the default) a dropped connection is picked up again
        with ``Last-Event-ID``; without it the server stops generating when the connection drops
        and the drop raises StreamInterrupted."""
        return self._events(self._stream_cursor(query, deadline_ms, resume, options))

    def resume(self, request_id: str, last_event_id: str | None = None) -> Iterator[StreamEvent]:
        """The events of a stream after ``last_event_id`` (all of them without one)."""
        return self._events(self._resume_cursor(request_id, last_event_id))

    def _events(self, cursor: _StreamCursor) -> Iterator[StreamEvent]:
        retries = _Retries(self.retries)
        while True:
            call, drop = cursor.call(), None
            try:
                with self._http.stream(call.method, call.path, json=call.body, headers=call.headers) as r:
                    if not r.is_success:
                        r.read()
                        time.sleep(retries.after_error(api_error(r)))
                        continue
                    cursor.opened(r)
                    for line in r.iter_lines():
                        event = cursor.feed(line)
                        if event is not None:
                            yield event
                        if cursor.finished:
                            return
            except httpx.TransportError as exc:
                drop = exc
            time.sleep(cursor.dropped(drop))

    def submit_job(
        self,
        query: str,
        *,
        idempotency_key: str | None = None,
        deadline_ms: int | None = None,
        **options: Unpack[JobOptions],
    ) -> JobAccepted:
        """Start an async job (``POST /v1/jobs``); :meth:`wait_job` waits for its answer. The same
        ``idempotency_key`` within a day returns the same job (one is made up when not given)."""
        return self._decode(
            JobAccepted, self._send(self._job_call(query, idempotency_key, deadline_ms, options))
        )

    def job(self, job_id: str) -> JobView:
        """A job's status, timestamps, and its result once done (``GET /v1/jobs/{id}``)."""
        return self._decode(JobView, self._send(_Call("GET", _path("/v1/jobs/{}", job_id))))

    def cancel_job(self, job_id: str) -> JobView:
        """Cancel a job that has not finished; Conflict when it has."""
        return self._decode(JobView, self._send(_Call("DELETE", _path("/v1/jobs/{}", job_id))))

    def wait_job(self, job_id: str, timeout: float = 300.0) -> JobView:
        """Poll until the job is done, failed or cancelled (its view, whichever it is); JobTimeout
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.job(job_id)
            if view.status in FINAL_JOB_STATUSES:
                return view
            if time.monotonic() >= deadline:
                raise JobTimeout(view, timeout)
            time.sleep(min(self._job_poll_s, max(0.0, deadline - time.monotonic())))

    def indexes(self) -> IndexList:
        """Every index with its current version and counts (``GET /v1/indexes``)."""
        return self._decode(IndexList, self._send(_Call("GET", "/v1/indexes")))

    def index(self, name: str) -> IndexDetail:
        """One index: version, documents, chunks, bytes, type (``GET /v1/indexes/{name}``)."""
        return self._decode(IndexDetail, self._send(_Call("GET", _path("/v1/indexes/{}", name))))


# -- the async client ---------------------------------------------------------------------------


class AsyncClient(_Base):
    """ragline over HTTP for asyncio: the same methods and options as :class:`Client`, awaited
    (``stream`` and ``resume`` are async iterators)."""

    _http_class = httpx.AsyncClient
    _http: httpx.AsyncClient

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> httpx.Response:
        retries = _Retries(self.retries)
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.body, headers=call.headers
                )
            except httpx.TransportError as exc:
                await asyncio.sleep(retries.after_failure(exc))
                continue
            if response.is_success:
                return response
            await asyncio.sleep(retries.after_error(api_error(response)))

    async def query(
        self,
        query: str,
        *,
        deadline_ms: int | None = None,
        **options: Unpack[QueryOptions],
    ) -> QueryResponse:
        """See :meth:`Client.query`."""
        call = _query_call("/v1/query", _query_body(QueryRequest, query, options), deadline_ms)
        return self._decode(QueryResponse, await self._send(call))

    def stream(
        self,
        query: str,
        *,
        deadline_ms: int | None = None,
        resume: bool = True,
        **options: Unpack[QueryOptions],
    ) -> AsyncIterator[StreamEvent]:
        """See :meth:`Client.stream`: ``async for event in client.stream(...)``."""
        return self._events(self._stream_cursor(query, deadline_ms, resume, options))

    def resume(self, request_id: str, last_event_id: str | None = None) -> AsyncIterator[StreamEvent]:
        """See :meth:`Client.resume`."""
        return self._events(self._resume_cursor(request_id, last_event_id))

    async def _events(self, cursor: _StreamCursor) -> AsyncIterator[StreamEvent]:
        retries = _Retries(self.retries)
        while True:
            call, drop = cursor.call(), None
            try:
                async with self._http.stream(
                    call.method, call.path, json=call.body, headers=call.headers
                ) as r:
                    if not r.is_success:
                        await r.aread()
                        await asyncio.sleep(retries.after_error(api_error(r)))
                        continue
                    cursor.opened(r)
                    async for line in r.aiter_lines():
                        event = cursor.feed(line)
                        if event is not None:
                            yield event
                        if cursor.finished:
                            return
            except httpx.TransportError as exc:
                drop = exc
            await asyncio.sleep(cursor.dropped(drop))

    async def submit_job(
        self,
        query: str,
        *,
        idempotency_key: str | None = None,
        deadline_ms: int | None = None,
        **options: Unpack[JobOptions],
    ) -> JobAccepted:
        """See :meth:`Client.submit_job`."""
        call = self._job_call(query, idempotency_key, deadline_ms, options)
        return self._decode(JobAccepted, await self._send(call))

    async def job(self, job_id: str) -> JobView:
        return self._decode(JobView, await self._send(_Call("GET", _path("/v1/jobs/{}", job_id))))

    async def cancel_job(self, job_id: str) -> JobView:
        return self._decode(JobView, await self._send(_Call("DELETE", _path("/v1/jobs/{}", job_id))))

    async def wait_job(self, job_id: str, timeout: float = 300.0) -> JobView:
        """See :meth:`Client.wait_job`."""
        deadline = time.monotonic() + timeout
        while True:
            view = await self.job(job_id)
            if view.status in FINAL_JOB_STATUSES:
                return view
            if time.monotonic() >= deadline:
                raise JobTimeout(view, timeout)
            await asyncio.sleep(min(self._job_poll_s, max(0.0, deadline - time.monotonic())))

    async def indexes(self) -> IndexList:
        return self._decode(IndexList, await self._send(_Call("GET", "/v1/indexes")))

    async def index(self, name: str) -> IndexDetail:
        return self._decode(IndexDetail, await self._send(_Call("GET", _path("/v1/indexes/{}", name))))
