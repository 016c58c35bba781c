"""Async jobs: through the query pipeline, a durable record, the same tasks; read back, cancelled."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import redis.asyncio as aioredis

from api.errors import ApiError, unavailable
from api.jobs_protocol import JobAccepted, JobRequest, JobView
from api.pipeline import Pipeline, QueryContext
from broker import jobs
from broker.cancel import arequest_cancel
from broker.contract import ContractError
from broker.keys import Keys
from broker.settings import JobSettings, RedisSettings, WebhookSettings
from broker.ssrf import ResolverBusy, WebhookRefused, check_url

_MAX_IDEMPOTENCY_KEY = 255
log = logging.getLogger(__name__)


def _not_found(job_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no job {job_id!r}")


def status_url(job_id: str) -> str:
    # Relative: right behind any proxy or host name the client used.
    return f"/v1/jobs/{job_id}"


def _accepted(job_id: str, status: str) -> JobAccepted:
    return JobAccepted(job_id=job_id, status=status, status_url=status_url(job_id))  # type: ignore[arg-type]


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
        s = self._webhooks
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
        record = jobs.new_record(
            job_id=ctx.job_id,
            owner=principal,
            request={"query": asked.query, "top_k": asked.top_k, "mode": body.mode, "index": asked.index},
            webhook_url=webhook_url,
            metadata=body.metadata,
            now=time.time(),
        )
        record["mode"] = asked.mode  # degraded: retrieval-only, so its stages end with retrieval
        digest = jobs.idempotency_digest(principal, idempotency_key) if idempotency_key else None
        for _ in range(2):
            created, job_id = await self._store.create(record, idempotency=digest)
            if created:
                break
            existing = await self._store.load(job_id)
            if existing is not None:
                if existing.get("fingerprint") != record["fingerprint"]:
                    raise ApiError(
                        422,
                        "idempotency_key_reused",
                        "this Idempotency-Key was used for a different request within "
                        f"{self._settings.idempotency_ttl_s // 3600} h",
                    )
                return _accepted(job_id, existing["status"]), True
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
        return _accepted(job_id, "queued"), False

    async def _owned(self, principal: str, job_id: str) -> dict[str, str]:
        if not job_id.isalnum() or len(job_id) > 64:
            raise _not_found(job_id)
        record = await self._store.load(job_id)
        # Another principal's job answers exactly like an unknown one: its existence is not shown.
        if record is None or record.get("owner") != principal:
            raise _not_found(job_id)
        return record

    async def get(self, principal: str, job_id: str) -> JobView:
        return _view(await self._owned(principal, job_id))

    async def cancel(self, principal: str, job_id: str) -> JobView:
        await self._owned(principal, job_id)
        outcome = await self._store.cancel(job_id)
        if outcome == "missing":
            raise _not_found(job_id)
        if outcome == "first":
            # A running generation task sees this within ~100 ms and aborts its engine request.
            await arequest_cancel(self._redis, self._keys, job_id, ttl_s=self._settings.cancel_ttl_s)
        record = await self._owned(principal, job_id)
        if record["status"] != "cancelled":
            raise ApiError(409, "already_finished", f"job {job_id} is already {record['status']}")
        return _view(record)


def _view(record: dict[str, str]) -> JobView:
    try:
        return JobView.model_validate(jobs.view(record))
    except ContractError as exc:
        log.error("job %s: its record breaks the contract: %s", record.get("id"), exc)
        raise ApiError(500, "failed", "the job's record could not be read") from None
