"""Async jobs: a durable record per job in Redis, forward-only stages, one final result.

A job is a query whose request id is the job id: it runs the same retrieval and generation tasks
and writes the same event stream; a :class:`JobTracker` hooked into the tasks' ``EventWriter``
mirrors the stream into the job record. Every state change is one Lua script, so concurrent or
redelivered tasks cannot move a job backwards, out of ``cancelled``, or finish it twice: only
the first final transition returns ``"first"``, and that same script appends the final event
and schedules the webhook (see ``broker/webhooks.py``).

Record ``ragline:job:{id}`` (a hash, TTL ``job_ttl_s`` from its last change): ``status``,
``owner`` (the principal), ``created_at``/``updated_at`` and ``{stage}_at`` (unix seconds),
``request`` and ``mode``, ``metadata``, ``fingerprint`` (Idempotency-Key replays must match),
``sources``/``result``/``error`` (JSON), ``webhook_url`` and the delivery fields
``delivery_id``, ``delivery_status``, ``delivery_attempts``, ``delivery_last``, ...

An ingest job (``kind`` ``ingest``: documents uploaded or deleted over HTTP) has the same record,
webhook and cancel; it goes ``queued`` -> ``ingesting`` -> final, keeps its ``progress``
(:class:`~broker.contract.IngestProgress`) while it runs and its
:class:`~broker.contract.IngestResult` as ``result``.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from broker.contract import (
    SOURCES,
    Cancelled,
    Done,
    Error,
    IngestProgress,
    IngestResult,
    Sources,
    decode_sources,
)
from broker.keys import Keys
from broker.leases import UNFINISHED_JOBS, CapReached
from broker.oom_script import AsyncStateScript, StateScript
from broker.settings import JobSettings, RedisSettings

STAGES = ("queued", "retrieving", "generating", "ingesting")
INGEST_KIND = "ingest"
FINAL_STATUSES = ("done", "failed", "cancelled")
STATUSES = STAGES + FINAL_STATUSES

_LUA_DIR = Path(__file__).parent


@cache
def lua(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


def _flat(fields: dict[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


def decode(raw: dict[bytes, bytes] | dict[str, str]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def idempotency_digest(principal: str, key: str) -> str:
    # Hashed: the key is client-chosen text of any length; scoped so keys never collide across principals.
    return hashlib.sha256(f"{principal}\0{key}".encode()).hexdigest()


def fingerprint(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def new_record(
    *,
    job_id: str,
    owner: str,
    request: dict[str, Any],
    webhook_url: str | None,
    metadata: dict[str, Any] | None,
    now: float,
) -> dict[str, str]:
    fields = {
        "id": job_id,
        "owner": owner,
        "status": "queued",
        "created_at": repr(now),
        "updated_at": repr(now),
        "queued_at": repr(now),
        "request": json.dumps(request, separators=(",", ":")),
        "mode": str(request.get("mode", "rag")),
        "fingerprint": fingerprint({**request, "webhook_url": webhook_url, "metadata": metadata}),
    }
    if metadata is not None:
        fields["metadata"] = json.dumps(metadata, separators=(",", ":"))
    if webhook_url:
        fields["webhook_url"] = webhook_url
        # One id per job's delivery, the same on every attempt: receivers dedupe on it.
        fields["delivery_id"] = uuid.uuid4().hex
        fields["delivery_status"] = "pending"
        fields["delivery_attempts"] = "0"
    return fields


def new_ingest_record(
    *, job_id: str, owner: str, request: dict[str, Any], webhook_url: str | None, now: float
) -> dict[str, str]:
    """An ingest job's record: ``request`` says what it changes (``index``, ``operation``, ...)."""
    record = new_record(
        job_id=job_id, owner=owner, request=request, webhook_url=webhook_url, metadata=None, now=now
    )
    return {**record, "kind": INGEST_KIND, "mode": INGEST_KIND}


def _final_fields(event: Done | Error, data: str) -> tuple[str, dict[str, str]]:
    """The job's final status and the field holding ``event`` (encoded as ``data``)."""
    if isinstance(event, Done):
        return "done", {"result": data}
    return ("cancelled" if isinstance(event, Cancelled) else "failed"), {"error": data}


class JobTracker:
    """Mirrors one request's events into its job record; used from worker threads."""

    def __init__(self, client: redis.Redis, keys: Keys, job_id: str, *, job_ttl_s: int) -> None:
        self._client = client
        self._keys = keys
        self.job_id = job_id
        self._key = keys.job(job_id)
        self._ttl_s = job_ttl_s
        self._advance = StateScript(client, lua("job_advance"))
        self._finish = StateScript(client, lua("job_finish"))

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
        outcome = self._finish(
            keys=[self._key, stream_key, self._keys.webhook_schedule, self._keys.stream_owner(self.job_id)],
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


def tracker(client: redis.Redis, keys: Keys, jobs: JobSettings, job_id: str | None) -> JobTracker | None:
    """The tracker for a task's ``job_id`` kwarg; None for a plain query."""
    if not job_id:
        return None
    return JobTracker(client, keys, job_id, job_ttl_s=jobs.job_ttl_s)


class AsyncJobStore:
    """The API's side: create (idempotently), read, cancel."""

    def __init__(self, client: aioredis.Redis, redis_settings: RedisSettings, jobs: JobSettings) -> None:
        self._client = client
        self._jobs = jobs
        self._streams = redis_settings
        self._keys = Keys(redis_settings.key_prefix)
        self._create = client.register_script(lua("job_create"))
        self._finish = AsyncStateScript(client, lua("job_finish"))

    async def create(self, record: dict[str, str], *, idempotency: str | None) -> tuple[bool, str]:
        """Store ``record``; with an idempotency digest, returns (False, existing id) on a replay.
        The owner keeps at most ``job_records_per_key`` records and ``job_record_bytes_per_key``
        bytes of finished ones: a create past either removes the owner's oldest finished ones
        that have nothing left to deliver. :class:`CapReached` when the owner already has
        ``key_max_unfinished_jobs`` jobs queued or running (nothing stored)."""
        job_id = record["id"]
        s = self._jobs
        created, found = await self._create(
            keys=[
                self._keys.job(job_id),
                self._keys.idempotency(idempotency or "-"),
                self._keys.jobs_of(record["owner"]),
                self._keys.job_bytes_of(record["owner"]),
                self._keys.open_jobs(record["owner"]),
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
                *_flat(record),
            ],
        )
        if int(created) < 0:
            raise CapReached(UNFINISHED_JOBS, s.key_max_unfinished_jobs)
        return bool(int(created)), found.decode() if isinstance(found, bytes) else found

    async def load(self, job_id: str) -> dict[str, str] | None:
        raw = await self._client.hgetall(self._keys.job(job_id))
        return decode(raw) if raw else None

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


def iso(ts: str | float | None) -> str | None:
    if ts in (None, ""):
        return None
    moment = datetime.fromtimestamp(float(ts), UTC)  # type: ignore[arg-type]
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json(record: dict[str, str], field: str) -> Any:
    raw = record.get(field)
    return json.loads(raw) if raw else None


def _result(record: dict[str, str]) -> dict[str, Any]:
    """A finished job's result: its `done` event (every field of it) and its sources.

    Raises ContractError when the record's `result` or `sources` do not decode.
    """
    done = Done.decode(record.get("result") or "")
    if record.get("done_at") and record.get("created_at"):
        total_ms = (float(record["done_at"]) - float(record["created_at"])) * 1000
        done = done.model_copy(update={"timings": done.timings.model_copy(update={"total_ms": total_ms})})
    sources = decode_sources(record.get("sources") or "[]")
    return {**done.model_dump(mode="json"), "sources": SOURCES.dump_python(sources, mode="json")}


def _error(record: dict[str, str]) -> dict[str, Any] | None:
    raw = record.get("error")
    return Error.decode(raw).model_dump(mode="json") if raw else None


def view(record: dict[str, str], *, delivery: bool = True) -> dict[str, Any]:
    """A job as JSON: the body of ``GET /v1/jobs/{id}`` and (without delivery state) the webhook's.

    Raises ContractError when the record's result or error does not decode.
    """
    status = record.get("status", "queued")
    ingest = record.get("kind") == INGEST_KIND
    result: dict[str, Any] | None = None
    if status == "done":
        result = (
            IngestResult.decode(record.get("result") or "").model_dump(mode="json")
            if ingest
            else _result(record)
        )
    body: dict[str, Any] = {
        "kind": record.get("kind", "query"),
        "job_id": record.get("id"),
        "status": status,
        "created_at": iso(record.get("created_at")),
        "updated_at": iso(record.get("updated_at")),
        "timestamps": {s: iso(record[f"{s}_at"]) for s in STATUSES if record.get(f"{s}_at")},
        "request": _json(record, "request"),
        "metadata": _json(record, "metadata"),
        "webhook_url": record.get("webhook_url"),
        "result": result,
        "error": _error(record),
        # Every job's view has the same fields (the API's JobView and the webhook body alike).
        "progress": _json(record, "progress") if ingest else None,
    }
    if delivery:
        body["webhook"] = delivery_view(record)
    return body


def delivery_view(record: dict[str, str]) -> dict[str, Any] | None:
    if not record.get("webhook_url"):
        return None
    state = record.get("delivery_status", "pending")
    return {
        "delivery_id": record.get("delivery_id"),
        "status": state,
        "attempts": int(record.get("delivery_attempts") or 0),
        "next_attempt_at": iso(record.get("delivery_next_at")) if state == "scheduled" else None,
        "last_attempt": _json(record, "delivery_last"),
        "delivered_at": iso(record.get("delivered_at")),
        "dead_lettered_at": iso(record.get("dead_at")),
    }
