"""What both clients share: calls, options, retries, a stream's cursor, the constructor."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NotRequired, TypedDict, TypeVar
from urllib.parse import quote, urlencode

import httpx
from pydantic import BaseModel

from ragline.client.errors import APIError, StreamInterrupted
from ragline.client.events import DoneEvent, ErrorEvent, SSEParser, StreamEvent, decode_event
from ragline.client.protocol import ChatTurn, JobRequest, MetadataFilter, QueryRequest

DEFAULT_URL = "http://127.0.0.1:8000"
FINAL_JOB_STATUSES = frozenset({"done", "failed", "cancelled"})
# A refusal asking for a longer wait than this is raised at once rather than slept on.
_MAX_RETRY_AFTER_S = 30.0
_BACKOFF_S = 0.25
_BACKOFF_MAX_S = 8.0


# -- what both clients share: requests, retries, a stream's cursor ---------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # A multipart body instead: its file parts and its form fields.
    files: list[tuple[str, tuple[str, bytes]]] | None = None
    data: dict[str, str] | None = None


# A file to upload: a path, or (name, content). Its name is its document id, its ending its type
# (.txt, .md, .rst, .html, as `ragline ingest` reads).
FileIn = str | os.PathLike[str] | tuple[str, bytes | str]


class DocumentIn(TypedDict):
    """A document given as text (``POST /v1/indexes/{name}/documents`` as JSON)."""

    id: str  # its id in the index: one with the same id is replaced
    text: str
    metadata: NotRequired[dict[str, str]]  # on each of its chunks, for query filters
    format: NotRequired[Literal["txt", "md", "rst", "html"]]  # how its text is read; txt by default


def _file_part(item: FileIn) -> tuple[str, tuple[str, bytes]]:
    if isinstance(item, tuple):
        name, content = item
        return "files", (name, content.encode() if isinstance(content, str) else content)
    path = Path(item)
    return "files", (path.name, path.read_bytes())


def _upload_call(
    index: str,
    files: Iterable[FileIn] | None,
    documents: Iterable[DocumentIn] | None,
    metadata: dict[str, str] | None,
    webhook_url: str | None,
) -> _Call:
    if (files is None) == (documents is None):
        raise ValueError("upload takes files or documents (one of them)")
    path = _path("/v1/indexes/{}/documents", index)
    if documents is not None:
        docs = [{**d, "metadata": {**(metadata or {}), **d.get("metadata", {})}} for d in documents]
        body: dict[str, Any] = {"documents": docs}
        if webhook_url:
            body["webhook_url"] = webhook_url
        return _Call("POST", path, body)
    data = {"metadata": json.dumps(metadata)} if metadata else {}
    if webhook_url:
        data["webhook_url"] = webhook_url
    return _Call("POST", path, files=[_file_part(f) for f in files or ()], data=data)


def _documents_call(index: str, after: str | None, limit: int) -> _Call:
    query = urlencode({"limit": limit, **({"after": after} if after is not None else {})})
    return _Call("GET", _path("/v1/indexes/{}/documents", index) + "?" + query)


class QueryOptions(TypedDict, total=False):
    """A query's options (``QueryRequest``'s fields); the server's defaults for those not given."""

    index: str  # the index to ask; the server's default index when not given
    top_k: int  # how many sources (1..50)
    mode: Literal["rag", "retrieval"]  # "retrieval": the sources only, no answer generated
    allow_degraded: bool  # when generation is too busy: sources only (True) or 503 (False)
    allow_early_exit: bool  # let the best source answer when it clears RAGLINE_EARLY_EXIT_SCORE
    ef_search: int  # HNSW search effort
    nprobe: int  # IVF lists probed
    retrieval: Literal["dense", "lexical", "hybrid"]  # the server's RAGLINE_RETRIEVAL_MODE when not given
    filter: MetadataFilter  # metadata every source must match: key -> value, [values] or {"prefix": …}
    diversity: bool  # cap the chunks of one section and one file in the sources (on by default)
    history: list[ChatTurn | dict[str, str]]  # earlier turns, oldest first: {role, content}
    max_tokens: int  # the answer's token limit (at most the server's RAGLINE_MAX_NEW_TOKENS)
    temperature: float  # 0 (greedy) up to the server's RAGLINE_MAX_TEMPERATURE
    stop: list[str]  # the answer ends before the first of these


class JobOptions(QueryOptions, total=False):
    webhook_url: str  # receives the finished job, signed (docs/webhooks.md)
    metadata: dict[str, Any]  # echoed back in the job and its webhook


def _path(template: str, *parts: str) -> str:
    """``template`` with each ``{}`` filled by one quoted path segment (an id cannot escape it)."""
    return template.format(*(quote(part, safe="") for part in parts))


def _query_call(path: str, body: QueryRequest, deadline_ms: int | None) -> _Call:
    headers = {"X-Request-Deadline-Ms": str(deadline_ms)} if deadline_ms is not None else {}
    return _Call("POST", path, body.model_dump(mode="json", exclude_unset=True), headers)


_Body = TypeVar("_Body", bound=QueryRequest)


def _query_body(model: type[_Body], query: str, options: Mapping[str, object]) -> _Body:
    # Only what the caller set travels, so the server's defaults apply to the rest. An unknown
    # option fails here, as the server would refuse it.
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    return model(query=query, **given)


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
        if self.request_id is None:
            # Nothing came back yet, not even the request id: ask again. (A resumed stream
            # starts with its request id.)
            assert self._first is not None
            return self._first
        headers = {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}
        # Without a first call the cursor was made to resume a known request id: never None here.
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
