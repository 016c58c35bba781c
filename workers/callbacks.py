"""The callbacks worker: ``celery -A ragline.workers.callbacks:app worker -Q callbacks -P threads``.

Delivers the webhooks of finished jobs: a signed POST of the job's final JSON per attempt, and
a small poller thread that moves due attempts from the Redis schedule onto the ``callbacks``
queue (retries wait in Redis, not as Celery ETA tasks; see ``broker/state/webhooks.py``). Light: no
torch, no models.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import redis
from ragline.broker.config.secret_policy import DefaultSecret, refuse_defaults
from ragline.broker.config.settings import get_settings
from ragline.broker.contract.messages import ContractError, WebhookDelivery
from ragline.broker.contract.queues import CALLBACKS_QUEUE, DELIVER_WEBHOOK_TASK
from ragline.broker.contract.records import JobRecord, JobView
from ragline.broker.limits.ssrf import ResolverBusy, Target, WebhookRefused, check_url, configure_resolver
from ragline.broker.metrics import WEBHOOK_DEAD_LETTERS, WEBHOOK_DELIVERIES
from ragline.broker.redis.durability import Replication
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import webhooks
from ragline.workers.bootstrap import bootstrap
from ragline.workers.hooked_task import hooked_task
from ragline.workers.task_call import TaskCall

log = logging.getLogger(__name__)
settings = get_settings()
configure_resolver(
    threads=settings.webhooks.webhook_dns_threads,
    queued=settings.webhooks.webhook_dns_queue,
)

_USER_AGENT = "ragline-webhooks/0.1"
# A scheduled attempt whose task has not claimed it this long after it was taken is sent again: the
# poller died before enqueueing it, or the task was lost on its way. Longer than a queue of
# deliveries usually waits, since each resend while it waits is a duplicate (a no-op) on the queue.
_SCHEDULE_LEASE_S = 30.0

T = TypeVar("T")


def _within_lease(write: Callable[[], T], until: float) -> T:
    """``write``, retried while Redis is away (a restart, a failover) until the attempt's lease
    ends: an outcome left unrecorded makes a redelivered task post the same webhook again."""
    pause = 0.1
    while True:
        try:
            return write()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() + pause >= until:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def _store() -> webhooks.DeliveryStore:
    return webhooks.DeliveryStore(
        sync_client(settings.redis),
        keys,
        settings.webhooks,
        job_ttl_s=settings.jobs.job_ttl_s,
        replication=Replication.of(settings.redis),
    )


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _request_for(target: Target) -> tuple[str, dict[str, str], dict[str, Any]]:
    """URL, extra headers and httpx extensions that connect to the address the guard checked,
    so a DNS answer that changed since the check cannot redirect the delivery."""
    if target.allowlisted or not target.addresses:
        return target.url, {}, {}
    ip = target.addresses[0]
    url = str(httpx.URL(target.url).copy_with(host=ip))
    default_port = 443 if target.scheme == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host
    headers = {"Host": host if target.port == default_port else f"{host}:{target.port}"}
    # TLS must still name (and verify the certificate of) the host, not the IP.
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    return url, headers, extensions


class HostSlots:
    """At most ``per_host`` attempts at once to one host in this process: a receiver that answers
    slowly (or trickles) holds that many delivery threads, never all of them."""

    def __init__(self, per_host: int) -> None:
        self.per_host = per_host
        self._busy: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, host: str) -> bool:
        with self._lock:
            if self._busy[host] >= self.per_host:
                return False
            self._busy[host] += 1
            return True

    def release(self, host: str) -> None:
        with self._lock:
            self._busy[host] -= 1
            if self._busy[host] <= 0:
                del self._busy[host]


host_slots = HostSlots(settings.webhooks.webhook_host_concurrency)


def attempt_delivery(record: dict[str, str], attempt: int) -> tuple[str, dict[str, Any]]:
    """POST the job's final JSON once; returns (delivered | gone | retry | deferred, what happened).
    ``deferred``: it never reached the receiver (this host's slots or the resolver were full)."""
    last: dict[str, Any] = {"attempt": attempt, "at": _now_iso(), "status_code": None, "error": None}
    try:
        job = JobRecord.decode(record)
    except ContractError as exc:
        # A record this worker cannot read (written by another release?): nothing is posted, and
        # the attempt counts, so it ends dead-lettered rather than retried forever.
        log.error("job %s: its record breaks the contract: %s", record.get("id"), exc)
        return "retry", {**last, "error": f"unreadable job record: {exc}", "duration_ms": 0.0}
    body = JobView.of(job, delivery=False).webhook_body()
    host = (urlsplit(job.webhook_url or "").hostname or "").lower()
    if not host_slots.acquire(host):
        error = f"deferred: {host_slots.per_host} deliveries to {host!r} already in flight"
        return "deferred", {**last, "error": error, "duration_ms": 0.0}
    try:
        return _post_once(job, body, last)
    finally:
        host_slots.release(host)


def _post_once(record: JobRecord, body: bytes, last: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    timestamp = str(int(time.time()))
    delivery_id = record.delivery_id or ""
    secret = webhooks.secret_for(
        sync_client(settings.redis), keys, record.owner, settings.webhooks.webhook_secret
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": _USER_AGENT,
        webhooks.SIGNATURE_HEADER: webhooks.sign(secret, timestamp, delivery_id, body),
        webhooks.TIMESTAMP_HEADER: timestamp,
        webhooks.DELIVERY_HEADER: delivery_id,
        webhooks.ATTEMPT_HEADER: str(last["attempt"]),
    }
    started = time.perf_counter()
    try:
        # Checked again at every attempt: the name may resolve elsewhere than at submit time.
        target = check_url(
            record.webhook_url or "",
            allowlist=settings.webhooks.webhook_host_allowlist,
            timeout_s=settings.webhooks.webhook_dns_timeout_s,
        )
        url, extra_headers, extensions = _request_for(target)
        code = asyncio.run(_post(url, body, {**headers, **extra_headers}, extensions))
    except ResolverBusy as exc:
        return "deferred", {**last, "error": f"deferred: {exc}"}
    except WebhookRefused as exc:
        last["error"] = f"refused: {exc}"
        return "retry", last
    except TimeoutError:
        last["error"] = f"deadline: no complete answer within {settings.webhooks.webhook_deadline_s:g}s"
        return "retry", last
    except httpx.HTTPError as exc:
        last["error"] = f"{type(exc).__name__}: {exc}"
        return "retry", last
    finally:
        last["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
    last["status_code"] = code
    if 200 <= code < 300:
        return "delivered", last
    if code == 410:  # the receiver says this endpoint is gone for good: stop
        return "gone", last
    return "retry", last


async def _post(url: str, body: bytes, headers: dict[str, str], extensions: dict[str, Any]) -> int:
    """The response's status, within webhook_deadline_s from the first byte sent to the last
    header read: httpx's own timeouts bound each read, and a receiver trickling a byte a read
    would hold the thread for ever without this."""
    async with (
        asyncio.timeout(settings.webhooks.webhook_deadline_s),
        httpx.AsyncClient(
            timeout=settings.webhooks.webhook_timeout_s, follow_redirects=False, trust_env=False
        ) as client,
        # Only the status matters; the body is never read, however large or slow.
        client.stream("POST", url, content=body, headers=headers, extensions=extensions) as response,
    ):
        return response.status_code


class SchedulePoller:
    """Enqueues due delivery attempts; one per worker process (several workers share safely)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-schedule", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def poll_once(self) -> int:
        store = _store()
        due = store.take_due(lease_s=_SCHEDULE_LEASE_S)
        for item in due:
            delivery = WebhookDelivery(job_id=item.job_id, attempt=item.attempt)
            # Left on the schedule, leased: the task's claim removes it (see webhooks.py).
            app.send_task(DELIVER_WEBHOOK_TASK, kwargs=delivery.encode(), queue=CALLBACKS_QUEUE)
        return len(due)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.warning("webhook schedule poll failed", exc_info=True)
            self._stop.wait(settings.webhooks.webhook_poll_interval_s)


_poller = SchedulePoller()


def _refuse_default_secrets() -> None:
    # At worker start, not at import (tests import this module to call its functions). Celery
    # logs and ignores an exception from a signal handler; SystemExit ends the worker.
    try:
        refuse_defaults(settings, "callbacks")
    except DefaultSecret as exc:
        log.critical("%s", exc)
        raise SystemExit(2) from None


worker = bootstrap(
    CALLBACKS_QUEUE,
    settings,
    init=[_refuse_default_secrets],
    ready=[_poller.start],
    shutdown=[_poller.stop],
)
app, keys = worker.app, worker.keys


# A payload that breaks the contract is dropped with a log line (DecodePayload); an attempt's own
# payloads never do, and one that did would be sent again when its schedule lease ended.
@hooked_task(app, DELIVER_WEBHOOK_TASK, WebhookDelivery)
def deliver_webhook(call: TaskCall[WebhookDelivery]) -> None:
    """One delivery attempt (:class:`~ragline.broker.contract.messages.WebhookDelivery`)."""
    delivery = call.payload
    job_id, attempt = delivery.job_id, delivery.attempt
    store = _store()
    # The lease outlasts one attempt (DNS + HTTP); past it a redelivered task may take over.
    lease_s = settings.webhooks.webhook_dns_timeout_s + settings.webhooks.webhook_deadline_s + 5
    record = store.claim(job_id, attempt, lease_s=lease_s)
    lease_ends = time.monotonic() + lease_s - 1
    if record is None:  # a duplicate, or the attempt already concluded
        return
    if store.confirmed(job_id, "webhook_claim"):
        outcome, last = attempt_delivery(record, attempt)
    else:  # posted now, a failover could hand the same attempt to another worker: later, for free
        error = "deferred: the attempt's claim is not on a Redis replica yet"
        outcome, last = (
            "deferred",
            {"attempt": attempt, "at": _now_iso(), "status_code": None, "error": error},
        )
    if outcome == "deferred":  # not the receiver's doing: soon, and for free
        wait_s = settings.webhooks.webhook_defer_s * random.uniform(0.5, 1.0)
    else:
        wait_s = webhooks.backoff_s(
            attempt,
            base_s=settings.webhooks.webhook_backoff_base_s,
            max_s=settings.webhooks.webhook_backoff_max_s,
        )
    next_due = time.time() + wait_s
    result = _within_lease(
        lambda: store.record(record, attempt, outcome=outcome, last=last, next_due=next_due), lease_ends
    )
    WEBHOOK_DELIVERIES.labels(outcome=result).inc()
    if result == "dead":
        WEBHOOK_DEAD_LETTERS.inc()
        log.warning("webhook for job %s dead-lettered after %d attempts: %s", job_id, attempt, last)
    else:
        log.info("webhook for job %s attempt %d: %s (%s)", job_id, attempt, result, last)
