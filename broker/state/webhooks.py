"""Webhook delivery state: signing, per-principal secrets, the retry schedule, dead letters.

Retries are not Celery ETA tasks: with the Redis transport a task held past ``visibility_timeout``
is delivered again (a duplicate). Instead, each due attempt is a member ``{job_id}:{attempt}`` of
the sorted set ``ragline:webhooks:scheduled`` scored by its due time; the callbacks worker polls
it, leasing what is due, and enqueues ``ragline.deliver_webhook`` for it. The entry stays until
the attempt's task claims it: a task lost on its way (pushed to a primary that died before a
replica had it, or popped by a worker as Redis went down) is sent again when the lease ends.
Every step is one Lua script on the job record: claim an attempt (a duplicate task gets no
claim), record its outcome together with the next attempt or the dead letter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import redis
from ragline.broker.config.settings import WebhookSettings
from ragline.broker.metrics import UNREPLICATED_WRITES
from ragline.broker.redis.durability import NO_WAIT, UNCONFIRMED, Replication
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.replies import text
from ragline.broker.redis.scripts import StateScript, lua

SIGNATURE_HEADER = "X-Ragline-Signature"
TIMESTAMP_HEADER = "X-Ragline-Timestamp"
DELIVERY_HEADER = "X-Ragline-Delivery"
ATTEMPT_HEADER = "X-Ragline-Attempt"
log = logging.getLogger(__name__)


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


# What a derived secret is the MAC of, before the principal: fixed, since receivers hold the result.
_DERIVATION_LABEL = b"ragline-webhook-secret:"


def derived_secret(deployment_secret: str, principal: str) -> str:
    """The secret a principal without one of its own signs with: ``whsec_`` + hex HMAC-SHA256,
    keyed with the deployment's secret, of ``ragline-webhook-secret:{principal}``. Each key gets
    its own this way, so a receiver holding one cannot sign a delivery to another key's receiver
    (as the deployment's secret itself, shared by every key, could); and only who holds the
    deployment's secret can compute one (``ragline webhooks secret show``)."""
    mac = hmac.new(deployment_secret.encode(), _DERIVATION_LABEL + principal.encode(), hashlib.sha256)
    return "whsec_" + mac.hexdigest()


def own_secret(client: redis.Redis, keys: Keys, principal: str) -> str | None:
    """The secret ``ragline webhooks secret set`` gave the principal, or None."""
    raw = client.get(keys.webhook_secret(principal))
    return text(raw) if raw else None


def secret_for(client: redis.Redis, keys: Keys, principal: str, deployment_secret: str) -> str:
    """What the principal's deliveries are signed with: its own secret when one is stored, else
    the one derived for it from the deployment's (:func:`derived_secret`), never the
    deployment's itself."""
    own = own_secret(client, keys, principal)
    return own if own is not None else derived_secret(deployment_secret, principal)


def set_secret(client: redis.Redis, keys: Keys, principal: str, secret: str) -> None:
    """Sign the principal's deliveries with ``secret`` from the next attempt on."""
    client.set(keys.webhook_secret(principal), secret.encode())


def clear_secret(client: redis.Redis, keys: Keys, principal: str) -> bool:
    """Back to the principal's derived secret; False when it had none of its own."""
    return bool(client.delete(keys.webhook_secret(principal)))


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Wait after failed attempt ``attempt`` (1-based): exponential, capped, half of it jittered
    so that many receivers failing together do not retry in lockstep."""
    ceiling = min(max_s, base_s * 2.0 ** (attempt - 1))
    uniform = rng.uniform if rng else random.uniform
    return ceiling / 2 + uniform(0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class Due:
    member: str
    job_id: str
    attempt: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse_member(member: bytes | str) -> Due:
    text = member.decode() if isinstance(member, bytes) else member
    job_id, _, attempt = text.rpartition(":")
    return Due(text, job_id, int(attempt))


class DeliveryStore:
    """The callbacks worker's side of the delivery state (sync client, any thread)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        settings: WebhookSettings,
        *,
        job_ttl_s: int,
        replication: Replication = NO_WAIT,
    ) -> None:
        self._client = client
        self._settings = settings
        self._job_ttl_s = job_ttl_s
        self._keys = keys
        self._replication = replication
        self._due = StateScript(client, lua(__package__, "webhook_due"))
        self._claim = StateScript(client, lua(__package__, "webhook_claim"))
        self._record = StateScript(client, lua(__package__, "webhook_record"))

    def take_due(self, *, lease_s: float = 30.0, limit: int = 100, now: float | None = None) -> list[Due]:
        members = self._due(
            keys=[self._keys.webhook_schedule],
            args=[repr(time.time() if now is None else now), repr(lease_s), limit],
        )
        return [_parse_member(m) for m in members]

    def claim(self, job_id: str, attempt: int, *, lease_s: float) -> dict[str, str] | None:
        """The job's hash, as text, when this task may make attempt ``attempt``, else None (a
        duplicate). Either way the attempt's schedule entry is gone: its task has arrived. Not
        decoded here: the attempt decodes it
        (:meth:`~ragline.broker.contract.records.JobRecord.decode`), and one that does not decode
        counts as a failed attempt, recorded with the text fields :meth:`record` reads."""
        reply = self._claim(
            keys=[self._keys.job(job_id), self._keys.webhook_schedule],
            args=[attempt, repr(time.time()), repr(lease_s), f"{job_id}:{attempt}"],
        )
        if not reply or reply[0] not in (b"go", "go"):
            return None
        flat = reply[1:]
        return {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}

    def confirmed(self, job_id: str, write: str) -> bool:
        """Whether the job's delivery state, as written so far, is on the replicas. A claim that
        is not must not be acted on: after a failover another worker could claim the same
        attempt again and the receiver would get it twice."""
        try:
            self._replication.confirm(self._client, self._keys.job(job_id), self._job_ttl_s)
        except UNCONFIRMED as exc:
            UNREPLICATED_WRITES.labels(write).inc()
            log.warning("job %s: its webhook %s is not confirmed on a replica: %s", job_id, write, exc)
            return False
        return True

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
        # Unconfirmed, a failover may bring the attempt back once its claim's lease ends: at worst a
        # second delivery under the same X-Ragline-Delivery id, which receivers drop.
        self.confirmed(job_id, "webhook_outcome")
        return result.decode() if isinstance(result, bytes) else result


def dead_letters(client: redis.Redis, keys: Keys, *, limit: int = 100) -> list[dict[str, Any]]:
    """Deliveries given up after their last attempt, newest first."""
    return [json.loads(raw) for raw in client.lrange(keys.webhook_dead, 0, max(0, limit - 1))]
