"""Async jobs: a durable record per job in Redis, forward-only stages, one final result.

A job is a query whose request id is the job id: it runs the same retrieval and generation tasks
and writes the same event stream; a :class:`JobTracker` hooked into the tasks' ``EventWriter``
mirrors the stream into the job record. Every state change is one Lua script, so concurrent or
redelivered tasks cannot move a job backwards, out of ``cancelled``, or finish it twice: only
the first final transition returns ``"first"``, and that same script appends the final event
and schedules the webhook (see ``broker/state/webhooks.py``).

Record ``ragline:job:{id}``: a hash, TTL ``job_ttl_s`` from its last change, whose fields are
:class:`~ragline.broker.contract.records.JobRecord`'s. Its ``request`` is the whole request as
validated, and its ``fingerprint`` a digest of it: an Idempotency-Key replay must match every
field (:func:`fingerprint`).

An ingest job (``kind`` ``ingest``: documents uploaded or deleted over HTTP) has the same record,
webhook and cancel; it goes ``queued`` -> ``ingesting`` -> final, keeps its ``progress``
(:class:`~ragline.broker.contract.messages.IngestProgress`) while it runs and its
:class:`~ragline.broker.contract.messages.IngestResult` as ``result``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Literal

import redis
import redis.asyncio as aioredis
from pydantic import BaseModel
from ragline.broker.config.settings import JobSettings, RedisSettings
from ragline.broker.contract.messages import (
    SOURCES,
    Cancelled,
    Done,
    Error,
    IngestProgress,
    IngestResult,
    Sources,
)
from ragline.broker.contract.records import IngestRequest, JobQuery, JobRecord
from ragline.broker.contract.requests import JobRequest
from ragline.broker.limits.leases import UNFINISHED_JOBS, CapReached
from ragline.broker.metrics import UNREPLICATED_WRITES
from ragline.broker.redis.durability import NO_WAIT, UNCONFIRMED, Replication
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import AsyncStateScript, StateScript, lua

INGEST_KIND = "ingest"
# A final state no replica confirmed is written again and confirmed again, this many times, the
# pause growing by this much each time (a failover's promotion takes seconds).
_CONFIRM_ATTEMPTS = 3
_CONFIRM_BACKOFF_S = 1.0
log = logging.getLogger(__name__)
# Marks a fingerprint of the whole request. One without it was made by an earlier release of
# four of its fields only: no new request can be compared with it.
FINGERPRINT_VERSION = "v2:"


def _flat(fields: dict[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


def idempotency_digest(principal: str, key: str) -> str:
    # Hashed: the key is client-chosen text of any length; scoped so keys never collide across principals.
    return hashlib.sha256(f"{principal}\0{key}".encode()).hexdigest()


def canonical_json(request: BaseModel) -> str:
    """``request`` as one canonical JSON text: every field, a default where the client gave
    none, keys sorted, no spaces."""
    return json.dumps(
        request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def fingerprint(request: BaseModel) -> str:
    """What a replay of an Idempotency-Key must match: a digest of the request's canonical JSON,
    so two requests match only when every field does (an omitted one equals its default)."""
    return FINGERPRINT_VERSION + hashlib.sha256(canonical_json(request).encode()).hexdigest()


def new_record(
    *,
    job_id: str,
    owner: str,
    request: JobRequest,
    now: float,
    mode: Literal["rag", "retrieval"] | None = None,
) -> JobRecord:
    """A query job's record, queued: ``request`` as validated, with the ``top_k`` and ``index``
    the job runs (:class:`JobQuery`), and ``mode`` its stages' (``retrieval`` once degraded)."""
    query = JobQuery.model_validate(request.model_dump(exclude={"webhook_url", "metadata"}))
    return _queued(
        job_id=job_id,
        owner=owner,
        request=query,
        mode=mode or request.mode,
        webhook_url=request.webhook_url,
        metadata=request.metadata,
        fingerprint=fingerprint(request),
        now=now,
    )


def new_ingest_record(
    *, job_id: str, owner: str, request: IngestRequest, webhook_url: str | None, now: float
) -> JobRecord:
    """An ingest job's record: ``request`` says what it changes."""
    return _queued(
        job_id=job_id,
        owner=owner,
        request=request,
        mode=INGEST_KIND,
        webhook_url=webhook_url,
        kind=INGEST_KIND,
        now=now,
    )


def _queued(
    *,
    job_id: str,
    owner: str,
    request: JobQuery | IngestRequest,
    mode: str,
    webhook_url: str | None,
    now: float,
    **fields: object,
) -> JobRecord:
    delivery = (
        # One id per job's delivery, the same on every attempt: receivers dedupe on it.
        {
            "webhook_url": webhook_url,
            "delivery_id": uuid.uuid4().hex,
            "delivery_status": "pending",
            "delivery_attempts": 0,
        }
        if webhook_url
        else {}
    )
    return JobRecord.model_validate(
        {
            **fields,
            **delivery,
            "id": job_id,
            "owner": owner,
            "request": request,
            "mode": mode,
            "status": "queued",
            "created_at": now,
            "updated_at": now,
            "queued_at": now,
        }
    )


def _final_fields(event: Done | Error, data: str) -> tuple[str, dict[str, str]]:
    """The job's final status and the field holding ``event`` (encoded as ``data``)."""
    if isinstance(event, Done):
        return "done", {"result": data}
    return ("cancelled" if isinstance(event, Cancelled) else "failed"), {"error": data}


class JobTracker:
    """Mirrors one request's events into its job record; used from worker threads."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        job_id: str,
        *,
        job_ttl_s: int,
        replication: Replication = NO_WAIT,
    ) -> None:
        self._client = client
        self._keys = keys
        self.job_id = job_id
        self._key = keys.job(job_id)
        self._ttl_s = job_ttl_s
        self._replication = replication
        self._advance = StateScript(client, lua(__package__, "job_advance"))
        self._finish = StateScript(client, lua(__package__, "job_finish"))

    def _run_advance(self, stage: str, *, needs_mode: str = "", fields: dict[str, str] | None = None) -> str:
        outcome, _status, _mode = self._advance(
            keys=[self._key],
            args=[stage, repr(time.time()), self._ttl_s, needs_mode, *_flat(fields or {})],
        )
        return outcome.decode() if isinstance(outcome, bytes) else outcome

    def start(self, stage: str) -> bool:
        """A task starts ``stage``; False when the job is gone or final (cancelled, say)."""
        return self._run_advance(stage) not in ("missing", "final")

    def on_sources(self, event: Sources) -> None:
        # Keep the sources for the result; a rag job now waits for (or is in) generation.
        sources = SOURCES.dump_json(event.sources).decode()
        self._run_advance("generating", needs_mode="rag", fields={"sources": sources})

    def progress(self, progress: IngestProgress) -> bool:
        """An ingest job's progress; False when the job is gone or final (cancelled, say)."""
        outcome = self._run_advance("", fields={"progress": progress.model_dump_json()})
        return outcome not in ("missing", "final")

    def finish(self, stream_key: str, event: Done | Error, *, stream_ttl_s: int, maxlen: int) -> str:
        """Append the final event and finish the job atomically; ``first`` exactly once per job."""
        data = event.encode()
        status, fields = _final_fields(event, data)
        return self._finish_with(stream_key, status, fields, event.type, data, stream_ttl_s, maxlen)

    def finish_ingest(
        self, stream_key: str, outcome: IngestResult | Error, *, stream_ttl_s: int, maxlen: int
    ) -> str:
        """An ingest job's end: its result (an ``ingested`` event on its stream) or its error."""
        if isinstance(outcome, IngestResult):
            data = outcome.encode()
            return self._finish_with(
                stream_key, "done", {"result": data}, "ingested", data, stream_ttl_s, maxlen
            )
        data = outcome.encode()
        status, fields = _final_fields(outcome, data)
        return self._finish_with(stream_key, status, fields, outcome.type, data, stream_ttl_s, maxlen)

    def _finish_with(
        self,
        stream_key: str,
        status: str,
        fields: dict[str, str],
        event_type: str,
        data: str,
        stream_ttl_s: int,
        maxlen: int,
    ) -> str:
        def finish() -> str:
            outcome = self._finish(
                keys=[
                    self._key,
                    stream_key,
                    self._keys.webhook_schedule,
                    self._keys.stream_owner(self.job_id),
                ],
                args=[
                    status,
                    repr(time.time()),
                    self._ttl_s,
                    stream_ttl_s,
                    maxlen,
                    event_type,
                    data,
                    self.job_id,
                    self._keys.job_bytes_of(""),
                    *_flat(fields),
                ],
            )
            return outcome.decode() if isinstance(outcome, bytes) else outcome

        outcome = finish()
        if outcome == "first":
            self._confirm(finish)
        return outcome

    def _confirm(self, finish: Callable[[], str]) -> None:
        """The job's final state is on the replicas before its task is acknowledged. Unconfirmed,
        the finish runs again: a no-op ("late") where it stood, written again where a failover
        lost it (the new primary has the job as it was before, and its task is acknowledged
        there next). The first outcome stands either way."""
        for attempt in range(1, _CONFIRM_ATTEMPTS + 1):
            try:
                self._replication.confirm(self._client, self._key, self._ttl_s)
                return
            except UNCONFIRMED as exc:
                UNREPLICATED_WRITES.labels("job_finish").inc()
                log.warning(
                    "job %s: its final state is not confirmed on a replica (%s), attempt %d",
                    self.job_id,
                    exc,
                    attempt,
                )
            time.sleep(_CONFIRM_BACKOFF_S * attempt)
            try:
                finish()
            except redis.RedisError as exc:
                log.warning("job %s: writing its final state again failed: %r", self.job_id, exc)
        log.error("job %s: its final state may be lost in a failover (no replica confirmed it)", self.job_id)


def tracker(
    client: redis.Redis,
    keys: Keys,
    jobs: JobSettings,
    job_id: str | None,
    replication: Replication = NO_WAIT,
) -> JobTracker | None:
    """The tracker for a task's ``job_id`` kwarg; None for a plain query."""
    if not job_id:
        return None
    return JobTracker(client, keys, job_id, job_ttl_s=jobs.job_ttl_s, replication=replication)


class AsyncJobStore:
    """The API's side: create (idempotently), read, cancel."""

    def __init__(self, client: aioredis.Redis, redis_settings: RedisSettings, jobs: JobSettings) -> None:
        self._client = client
        self._jobs = jobs
        self._streams = redis_settings
        self._keys = Keys(redis_settings.key_prefix)
        self._replication = Replication.of(redis_settings)
        self._create = client.register_script(lua(__package__, "job_create"))
        self._finish = AsyncStateScript(client, lua(__package__, "job_finish"))

    async def create(self, record: JobRecord, *, idempotency: str | None) -> tuple[bool, str]:
        """Store ``record``; with an idempotency digest, returns (False, existing id) on a replay.
        The owner keeps at most ``job_records_per_key`` records and ``job_record_bytes_per_key``
        bytes of finished ones: a create past either removes the owner's oldest finished ones
        that have nothing left to deliver. :class:`CapReached` when the owner already has
        ``key_max_unfinished_jobs`` jobs queued or running (nothing stored)."""
        job_id, owner = record.id, record.owner
        s = self._jobs
        created, found = await self._create(
            keys=[
                self._keys.job(job_id),
                self._keys.idempotency(idempotency or "-"),
                self._keys.jobs_of(owner),
                self._keys.job_bytes_of(owner),
                self._keys.open_jobs(owner),
            ],
            args=[
                job_id,
                s.job_ttl_s,
                s.idempotency_ttl_s,
                "1" if idempotency else "0",
                s.job_records_per_key,
                repr(time.time()),
                self._keys.job(""),
                s.job_record_bytes_per_key,
                s.key_max_unfinished_jobs,
                *_flat(record.encode()),
            ],
        )
        if int(created) < 0:
            raise CapReached(UNFINISHED_JOBS, s.key_max_unfinished_jobs)
        return bool(int(created)), found.decode() if isinstance(found, bytes) else found

    async def confirm(self, job_id: str, *, idempotency: str | None) -> None:
        """The job, and every write made before this call (its task on the queue), are on the
        replicas. Else the job is undone (:meth:`discard`: a retry with its key starts afresh; a
        task already queued finds no job and does nothing) and :class:`NotReplicated` raised."""
        try:
            await self._replication.aconfirm(self._client, self._keys.job(job_id), self._jobs.job_ttl_s)
        except UNCONFIRMED:
            await self.discard(job_id, idempotency=idempotency)
            raise

    async def load(self, job_id: str) -> JobRecord | None:
        """The job's record (None when there is none); ContractError when it does not decode."""
        raw = await self._client.hgetall(self._keys.job(job_id))
        return JobRecord.decode(raw) if raw else None

    async def discard(self, job_id: str, *, idempotency: str | None) -> None:
        """Undo a create whose task could not be enqueued, so a retry with the same key starts afresh."""
        keys = [self._keys.job(job_id)]
        if idempotency:
            keys.append(self._keys.idempotency(idempotency))
        await self._client.delete(*keys)

    async def forget_idempotency(self, idempotency: str) -> None:
        await self._client.delete(self._keys.idempotency(idempotency))

    async def cancel(self, job_id: str, message: str = "cancelled") -> str:
        """Cancel like a worker would finish: error event 499 + final state + webhook, atomically."""
        event = Cancelled(message=message)
        data = event.encode()
        status, fields = _final_fields(event, data)
        outcome = await self._finish(
            keys=[
                self._keys.job(job_id),
                self._keys.events(job_id),
                self._keys.webhook_schedule,
                self._keys.stream_owner(job_id),
            ],
            args=[
                status,
                repr(time.time()),
                self._jobs.job_ttl_s,
                self._streams.event_stream_done_ttl_s,
                self._streams.event_stream_maxlen,
                event.type,
                data,
                job_id,
                self._keys.job_bytes_of(""),
                *_flat(fields),
            ],
        )
        return outcome.decode() if isinstance(outcome, bytes) else outcome
