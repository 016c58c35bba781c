"""The blocking client (httpx)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Unpack

import httpx

from ragline.client.base import (
    FINAL_JOB_STATUSES,
    DocumentIn,
    FileIn,
    JobOptions,
    QueryOptions,
    _Base,
    _Call,
    _documents_call,
    _path,
    _query_body,
    _query_call,
    _Retries,
    _StreamCursor,
    _upload_call,
)
from ragline.client.errors import JobFailed, JobTimeout, api_error
from ragline.client.events import StreamEvent
from ragline.client.protocol import (
    DocumentList,
    IndexDetail,
    IndexList,
    JobAccepted,
    JobView,
    QueryRequest,
    QueryResponse,
)

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
                response = self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    headers=call.headers,
                    files=call.files,
                    data=call.data,
                )
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
        which it stops. A RestartEvent among the tokens says the answer starts again: drop the
        tokens before it. With ``resume`` (the default) a dropped connection is picked up again
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

    # -- documents: each write a job, waited for unless ``wait=False`` ---------------------------

    def upload(
        self,
        index: str,
        files: Iterable[FileIn] | None = None,
        documents: Iterable[DocumentIn] | None = None,
        *,
        metadata: dict[str, str] | None = None,
        webhook_url: str | None = None,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> JobView:
        """Add ``files`` (paths, or ``(name, content)``; each name is its document id) or
        ``documents`` (:class:`DocumentIn`: ``{id, text, metadata, format}``) to ``index``, made
        on the first upload; a document with an id the index has replaces it. ``metadata`` goes on
        every one. Waits for the job (JobFailed if it fails) and returns it: ``job.result.version``
        is the new version, ``job.progress`` the chunks embedded of the total. The same upload
        sent twice (a retry) gives the same documents, in one more version."""
        call = _upload_call(index, files, documents, metadata, webhook_url)
        accepted = self._decode(JobAccepted, self._send(call))
        return self._settle(accepted, wait, timeout)

    def documents(self, index: str, *, after: str | None = None, limit: int = 100) -> DocumentList:
        """A page of ``index``'s documents in id order (ids, titles, paths, chunk counts);
        pass ``next_after`` as ``after`` for the next one."""
        return self._decode(DocumentList, self._send(_documents_call(index, after, limit)))

    def delete_document(
        self, index: str, doc_id: str, *, wait: bool = True, timeout: float = 600.0
    ) -> JobView:
        """Drop a document: the job builds the next version without it."""
        call = _Call("DELETE", _path("/v1/indexes/{}/documents/{}", index, doc_id))
        accepted = self._decode(JobAccepted, self._send(call))
        return self._settle(accepted, wait, timeout)

    def delete_index(self, index: str, *, wait: bool = True, timeout: float = 600.0) -> JobView:
        """Delete an index: queries answer 404 at once; the job removes its files."""
        call = _Call("DELETE", _path("/v1/indexes/{}", index))
        accepted = self._decode(JobAccepted, self._send(call))
        return self._settle(accepted, wait, timeout)

    def _settle(self, accepted: JobAccepted, wait: bool, timeout: float) -> JobView:
        if not wait:
            return self.job(accepted.job_id)
        view = self.wait_job(accepted.job_id, timeout)
        if view.status != "done":
            raise JobFailed(view)
        return view
