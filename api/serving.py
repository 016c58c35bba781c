"""Query serving: validate, enqueue retrieval by task name, relay the request's events."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from api.errors import ApiError
from api.protocol import QueryRequest, QueryResponse, Source, Timings, Usage
from broker import indexes
from broker.events import Event, EventTimeout, read_events
from broker.keys import Keys
from broker.queues import RETRIEVAL_QUEUE, RETRIEVE_TASK
from broker.settings import Settings

_INDEX_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENQUEUE_TIMEOUT_S = 5.0


class QueryService:
    def __init__(self, settings: Settings, redis: aioredis.Redis, celery: Celery) -> None:
        self._settings = settings
        self._redis = redis
        self._celery = celery
        self._keys = Keys(settings.key_prefix)
        # kombu's publish is blocking I/O: keep it off the event loop.
        self._publish_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="publish")

    def close(self) -> None:
        self._publish_pool.shutdown(wait=False, cancel_futures=True)

    async def admit(self, req: QueryRequest) -> tuple[str, int, str]:
        """Check the request beyond its types; returns (query, top_k, index)."""
        s = self._settings
        query = req.query.strip()
        if not query:
            raise ApiError(422, "invalid_request", "query must not be empty")
        size = len(query.encode())
        if size > s.max_query_bytes:
            raise ApiError(422, "invalid_request", f"query is {size} bytes; the limit is {s.max_query_bytes}")
        top_k = s.default_top_k if req.top_k is None else req.top_k
        if not 1 <= top_k <= s.max_top_k:
            raise ApiError(422, "invalid_request", f"top_k must be between 1 and {s.max_top_k}, got {top_k}")
        index = req.index or s.default_index
        if not _INDEX_NAME.match(index):
            raise ApiError(422, "invalid_request", "index must match [A-Za-z0-9_.-]{1,64}")
        if await indexes.alookup(self._redis, self._keys, index) is None:
            raise ApiError(404, "unknown_index", f"index {index!r} does not exist; ingest it first")
        return query, top_k, index

    async def submit(self, request_id: str, req: QueryRequest, *, job_id: str | None = None) -> None:
        query, top_k, index = await self.admit(req)
        kwargs: dict[str, Any] = {
            "request_id": request_id,
            "query": query,
            "top_k": top_k,
            "mode": req.mode,
            "index": index,
            "enqueued_at": time.time(),
        }
        if job_id is not None:
            kwargs["job_id"] = job_id  # an async job: the tasks mirror their events into its record
        loop = asyncio.get_running_loop()
        publish = loop.run_in_executor(
            self._publish_pool,
            lambda: self._celery.send_task(RETRIEVE_TASK, kwargs=kwargs, queue=RETRIEVAL_QUEUE),
        )
        try:
            await asyncio.wait_for(publish, _ENQUEUE_TIMEOUT_S)
        except Exception as exc:
            raise ApiError(
                503, "unavailable", f"could not enqueue the request: {exc!r}", headers={"Retry-After": "1"}
            ) from exc

    def events(self, request_id: str, *, after: str = "0-0") -> AsyncIterator[Event]:
        return read_events(
            self._redis, self._keys, request_id, after=after, timeout_s=self._settings.request_timeout_s
        )

    async def answer(self, request_id: str, req: QueryRequest) -> QueryResponse:
        started = time.perf_counter()
        await self.submit(request_id, req)
        sources: list[dict[str, Any]] = []
        try:
            async for event in self.events(request_id):
                if event.type == "sources":
                    sources = event.data["sources"]
                elif event.type == "error":
                    status = int(event.data.get("status", 500))
                    raise ApiError(
                        status, "unknown_index" if status == 404 else "failed", event.data["message"]
                    )
                elif event.type == "done":
                    timings = {
                        **event.data.get("timings", {}),
                        "total_ms": (time.perf_counter() - started) * 1000,
                    }
                    usage = event.data.get("usage")
                    return QueryResponse(
                        request_id=request_id,
                        answer=event.data.get("answer"),
                        sources=[Source(**s) for s in sources],
                        timings=Timings(**{k: v for k, v in timings.items() if k in Timings.model_fields}),
                        usage=Usage(**usage) if usage else None,
                    )
        except EventTimeout as exc:
            raise ApiError(
                504, "timeout", f"no answer within {self._settings.request_timeout_s:.0f}s"
            ) from exc
        raise ApiError(500, "failed", "the event stream ended without an answer")
