"""Async jobs: through the query pipeline, a durable record, the same tasks; read back, cancelled."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import redis.asyncio as aioredis
from ragline.api.errors import ApiError, unavailable
from ragline.api.jobs.protocol import JobAccepted, JobRequest, JobView
from ragline.api.pipeline import Pipeline, QueryContext
from ragline.broker.config.settings import JobSettings, RedisSettings, WebhookSettings
from ragline.broker.contract.messages import ContractError
from ragline.broker.contract.records import JobRecord
from ragline.broker.limits.ssrf import ResolverBusy, WebhookRefused, check_url
from ragline.broker.redis.keys import Keys
from ragline.broker.state import jobs
from ragline.broker.streams.cancel import arequest_cancel

_MAX_IDEMPOTENCY_KEY = 255
log = logging.getLogger(__name__)


def _not_found(job_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no job {job_id!r}")


def status_url(job_id: str) -> str:
    # Relative: right behind any proxy or host name the client used.
    return f"/v1/jobs/{job_id}"


def _accepted(job_id: str, status: str) -> JobAccepted:
    # status: a JobStatus, "queued" or read back from a record this service created.
    return JobAccepted(job_id=job_id, status=status, status_url=status_url(job_id))  # type: ignore[arg-type]  # see above


async def checked_webhook(s: WebhookSettings, url: str) -> str:
    """``url`` when a job may deliver to it, else 422 saying why (503 when DNS is saturated)."""
    try:
        # getaddrinfo blocks: off the event loop, and bounded by the guard itself.
        await asyncio.to_thread(
            check_url, url, allowlist=s.webhook_host_allowlist, timeout_s=s.webhook_dns_timeout_s
        )
    except ResolverBusy as exc:  # ours to fix, not the URL's: the client may try again
        raise unavailable(str(exc)) from None
    except WebhookRefused as exc:
        raise ApiError(422, "invalid_webhook_url", str(exc)) from None
    return url


class JobService:
    def __init__(
        self,
        settings: JobSettings,
        webhooks: WebhookSettings,
        redis_settings: RedisSettings,
        redis: aioredis.Redis,
        pipeline: Pipeline,
    ) -> None:
        self._settings = settings
        self._webhooks = webhooks
        self._redis = redis
        self._pipeline = pipeline
        self._keys = Keys(redis_settings.key_prefix)
        self._store = jobs.AsyncJobStore(redis, redis_settings, settings)

    async def _check_webhook(self, url: str) -> str:
        return await checked_webhook(self._webhooks, url)

    def _check_metadata(self, metadata: dict[str, object] | None) -> None:
        if metadata is None:
            return
        size = len(json.dumps(metadata, separators=(",", ":")).encode())
        limit = self._settings.job_metadata_max_bytes
        if size > limit:
            raise ApiError(422, "invalid_request", f"metadata is {size} bytes of JSON; the limit is {limit}")

    @staticmethod
    def _check_key(key: str) -> None:
        if not 1 <= len(key) <= _MAX_IDEMPOTENCY_KEY or not key.isprintable():
            limit = _MAX_IDEMPOTENCY_KEY
            raise ApiError(422, "invalid_request", f"Idempotency-Key must be 1..{limit} printable characters")

    async def submit(
        self, ctx: QueryContext[JobRequest], *, principal: str, idempotency_key: str | None
    ) -> tuple[JobAccepted, bool]:
        """Create and enqueue a validated job; returns (accepted, replayed) — replayed for a known key.

        Through the pipeline like a query, but for the result cache: a job runs its tasks, whose
        events drive its record. Admission applies as to a query with the same deadline (the
        ``X-Request-Deadline-Ms`` header, else the default): admitted, the job is queued;
        degraded, it runs retrieval-only and its result says so; refused, it is not created
        (503 with Retry-After), so a retry with the same Idempotency-Key starts it then.
        """
        body = ctx.request
        assert body is not None
        if idempotency_key is not None:
            self._check_key(idempotency_key)
        self._check_metadata(body.metadata)
        webhook_url = await self._check_webhook(body.webhook_url) if body.webhook_url else None
        ctx.job_id = ctx.request_id  # the job's request id: one id in logs, events and the job record
        ctx.decision = self._pipeline.decide(ctx)
        await self._pipeline.index(ctx)
        await self._pipeline.admission(ctx, use_cache=False)
        asked = ctx.asked
        # The request as validated, with what the job runs where the client left it to the
        # server: the record keeps it whole, and a replay of its key must match all of it.
        request = body.model_copy(
            update={
                "query": asked.query,
                "top_k": asked.top_k,
                "index": asked.index,
                "webhook_url": webhook_url,
            }
        )
        # Degraded: retrieval-only, so its stages end with retrieval.
        record = jobs.new_record(
            job_id=ctx.job_id, owner=principal, request=request, mode=asked.mode, now=time.time()
        )
        digest = jobs.idempotency_digest(principal, idempotency_key) if idempotency_key else None
        for _ in range(2):
            created, job_id = await self._store.create(record, idempotency=digest)
            if created:
                break
            existing = await self._load(job_id)
            if existing is not None:
                if existing.fingerprint != record.fingerprint:
                    raise self._reused(existing)
                return _accepted(job_id, existing.status), True
            # The job expired before its key did: the key names nothing, start afresh.
            await self._store.forget_idempotency(digest or "")
        else:
            raise ApiError(503, "unavailable", "could not create the job", headers={"Retry-After": "1"})
        try:
            await self._pipeline.enqueue(ctx)
        except ApiError:
            # Nothing was enqueued: forget the job so that a retry with the same key enqueues it.
            await self._store.discard(job_id, idempotency=digest)
            raise
        await self._pipeline.own(job_id, principal)  # its events stream by its id, to its owner only
        # A 202 promises the job survives the primary's loss: on the replicas, or refused (503).
        await self._store.confirm(job_id, idempotency=digest)
        return _accepted(job_id, "queued"), False

    def _reused(self, existing: JobRecord) -> ApiError:
        within = f"within {self._settings.idempotency_ttl_s // 3600} h"
        if not (existing.fingerprint or "").startswith(jobs.FINGERPRINT_VERSION):
            # Its record keeps four fields of its request: whether this one is the same cannot be told.
            return ApiError(
                422,
                "idempotency_key_reused",
                f"this Idempotency-Key was used {within} by a job an earlier release created, "
                "whose request cannot be compared with this one: use another key",
            )
        return ApiError(
            422, "idempotency_key_reused", f"this Idempotency-Key was used for a different request {within}"
        )

    async def _load(self, job_id: str) -> JobRecord | None:
        try:
            return await self._store.load(job_id)
        except ContractError as exc:
            log.error("job %s: its record breaks the contract: %s", job_id, exc)
            raise ApiError(500, "failed", "the job's record could not be read") from None

    async def _owned(self, principal: str, job_id: str) -> JobRecord:
        if not job_id.isalnum() or len(job_id) > 64:
            raise _not_found(job_id)
        record = await self._load(job_id)
        # Another principal's job answers exactly like an unknown one: its existence is not shown.
        if record is None or record.owner != principal:
            raise _not_found(job_id)
        return record

    async def get(self, principal: str, job_id: str) -> JobView:
        return JobView.of(await self._owned(principal, job_id))

    async def cancel(self, principal: str, job_id: str) -> JobView:
        await self._owned(principal, job_id)
        outcome = await self._store.cancel(job_id)
        if outcome == "missing":
            raise _not_found(job_id)
        if outcome == "first":
            # A running generation task sees this within ~100 ms and aborts its engine request.
            await arequest_cancel(self._redis, self._keys, job_id, ttl_s=self._settings.cancel_ttl_s)
        record = await self._owned(principal, job_id)
        if record.status != "cancelled":
            raise ApiError(409, "already_finished", f"job {job_id} is already {record.status}")
        return JobView.of(record)
