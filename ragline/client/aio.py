"""The asyncio client: the same methods as the blocking one, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
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
                    call.method,
                    call.path,
                    json=call.body,
                    headers=call.headers,
                    files=call.files,
                    data=call.data,
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

    # -- documents: each write a job, waited for unless ``wait=False`` ---------------------------

    async def upload(
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
        """See :meth:`Client.upload`."""
        call = _upload_call(index, files, documents, metadata, webhook_url)
        accepted = self._decode(JobAccepted, await self._send(call))
        return await self._settle(accepted, wait, timeout)

    async def documents(self, index: str, *, after: str | None = None, limit: int = 100) -> DocumentList:
        """See :meth:`Client.documents`."""
        return self._decode(DocumentList, await self._send(_documents_call(index, after, limit)))

    async def delete_document(
        self, index: str, doc_id: str, *, wait: bool = True, timeout: float = 600.0
    ) -> JobView:
        """See :meth:`Client.delete_document`."""
        call = _Call("DELETE", _path("/v1/indexes/{}/documents/{}", index, doc_id))
        accepted = self._decode(JobAccepted, await self._send(call))
        return await self._settle(accepted, wait, timeout)

    async def delete_index(self, index: str, *, wait: bool = True, timeout: float = 600.0) -> JobView:
        """See :meth:`Client.delete_index`."""
        call = _Call("DELETE", _path("/v1/indexes/{}", index))
        accepted = self._decode(JobAccepted, await self._send(call))
        return await self._settle(accepted, wait, timeout)

    async def _settle(self, accepted: JobAccepted, wait: bool, timeout: float) -> JobView:
        if not wait:
            return await self.job(accepted.job_id)
        view = await self.wait_job(accepted.job_id, timeout)
        if view.status != "done":
            raise JobFailed(view)
        return view
