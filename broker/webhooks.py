"""Webhook delivery state: signing, per-principal secrets, the retry schedule, dead letters.

Retries are not Celery ETA tasks: with the Redis transport a task held past ``visibility_timeout``
is delivered again (a duplicate). Instead, each due attempt is a member ``{job_id}:{attempt}`` of
the sorted set ``ragline:webhooks:scheduled`` scored by its due time; the callbacks worker polls
it and enqueues ``ragline.deliver_webhook`` for what is due. Every step is one Lua script on the
job record: claim an attempt (a duplicate task gets no claim), record its outcome together with
the next attempt or the dead letter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import redis

from broker.jobs import decode, lua
from broker.keys import Keys
from broker.oom_script import StateScript
from broker.settings import WebhookSettings

SIGNATURE_HEADER = "X-Ragline-Signature"
TIMESTAMP_HEADER = "X-Ragline-Timestamp"
DELIVERY_HEADER = "X-Ragline-Delivery"
ATTEMPT_HEADER = "X-Ragline-Attempt"


def sign(secret: str, timestamp: str, delivery_id: str, body: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256 of ``{timestamp}.{delivery_id}.{body}`` with the principal's
    secret. The delivery id is what receivers drop duplicates on: signed, a captured delivery
    cannot come back under a fresh id inside the timestamp's window."""
    message = f"{timestamp}.{delivery_id}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    secret: str, timestamp: str, delivery_id: str, body: bytes, signature: str, *, tolerance_s: float = 300.0
) -> bool:
    """The receiver's check (documented in docs/webhooks.md): a fresh timestamp and a matching MAC."""
    try:
        fresh = abs(time.time() - int(timestamp)) <= tolerance_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, delivery_id, body), signature)


def secret_for(client: redis.Redis, keys: Keys, principal: str, default: str) -> str:
    """The principal's own secret when one is stored, else the deployment-wide one."""
    raw = client.get(keys.webhook_secret(principal))
    return raw.decode() if raw else default


def set_secret(client: redis.Redis, keys: Keys, principal: str, secret: str) -> None:
    """Sign the principal's deliveries with ``secret`` from the next attempt on."""
    client.set(keys.webhook_secret(principal), secret.encode())


def clear_secret(client: redis.Redis, keys: Keys, principal: str) -> bool:
    """Back to the deployment-wide secret; False when the principal had none of its own."""
    return bool(client.delete(keys.webhook_secret(principal)))


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Wait after failed attempt ``attempt`` (1-based): exponential, capped, half of it jittered
    so that many receivers failing together do not retry in lockstep."""
    ceiling = min(max_s, base_s * 2 ** (attempt - 1))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class Due:
    member: str
    job_id: str
    attempt: int


def _parse_member(member: bytes | str) -> Due:
    text = member.decode() if isinstance(member, bytes) else member
    job_id, _, attempt = text.rpartition(":")
    return Due(text, job_id, int(attempt))


class DeliveryStore:
    """The callbacks worker's side of the delivery state (sync client, any thread)."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: WebhookSettings, *, job_ttl_s: int) -> None:
        self._client = client
        self._settings = settings
        self._job_ttl_s = job_ttl_s
        self._keys = keys
        self._due = StateScript(client, lua("webhook_due"))
        self._claim = StateScript(client, lua("webhook_claim"))
        self._record = StateScript(client, lua("webhook_record"))

    def take_due(self, *, lease_s: float = 30.0, limit: int = 100, now: float | None = None) -> list[Due]:
        members = self._due(
            keys=[self._keys.webhook_schedule],
            args=[repr(time.time() if now is None else now), repr(lease_s), limit],
        )
        return [_parse_member(m) for m in members]

    def done_scheduling(self, due: Due) -> None:
        """The attempt is on the queue: drop its schedule entry."""
        self._client.zrem(self._keys.webhook_schedule, due.member)

    def claim(self, job_id: str, attempt: int, *, lease_s: float) -> dict[str, str] | None:
        """The job record when this task may make attempt ``attempt``, else None (a duplicate)."""
        reply = self._claim(keys=[self._keys.job(job_id)], args=[attempt, repr(time.time()), repr(lease_s)])
        if not reply or reply[0] not in (b"go", "go"):
            return None
        flat = reply[1:]
        return decode(dict(zip(flat[::2], flat[1::2], strict=True)))

    def record(
        self,
        record: dict[str, str],
        attempt: int,
        *,
        outcome: str,
        last: dict[str, Any],
        next_due: float,
    ) -> str:
        """Store attempt ``attempt``'s outcome (delivered | gone | retry | deferred: it never reached
        the receiver, so it runs again at ``next_due`` and does not count); returns what happens
        next: delivered | gone | scheduled | dead | deferred (| stale when another task took the
        attempt over)."""
        s = self._settings
        job_id = record["id"]
        dead = {
            "job_id": job_id,
            "delivery_id": record.get("delivery_id"),
            "owner": record.get("owner"),
            "webhook_url": record.get("webhook_url"),
            "status": record.get("status"),
            "attempts": attempt,
            "last_attempt": last,
            "dead_at": time.time(),
        }
        result = self._record(
            keys=[self._keys.job(job_id), self._keys.webhook_schedule, self._keys.webhook_dead],
            args=[
                attempt,
                repr(time.time()),
                outcome,
                json.dumps(last),
                s.webhook_max_attempts,
                repr(next_due),
                job_id,
                s.webhook_dead_letter_max,
                self._job_ttl_s,
                json.dumps(dead),
            ],
        )
        return result.decode() if isinstance(result, bytes) else result


def dead_letters(client: redis.Redis, keys: Keys, *, limit: int = 100) -> list[dict[str, Any]]:
    """Deliveries given up after their last attempt, newest first."""
    return [json.loads(raw) for raw in client.lrange(keys.webhook_dead, 0, max(0, limit - 1))]
