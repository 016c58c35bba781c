"""Webhook signing, backoff, and the delivery state machine on a real Redis."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
import uuid

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Done
from ragline.broker.contract.records import JobRecord, WebhookState
from ragline.broker.contract.requests import JobRequest
from ragline.broker.redis.keys import Keys
from ragline.broker.state import jobs, webhooks

from tests.webhook_receiver import documented_verify

PREFIX = "ragline-test-webhooks"
KEYS = Keys(PREFIX)


@pytest.fixture
def cfg(redis_url: str) -> Settings:
    return Settings().replace(redis_url=redis_url, key_prefix=PREFIX, webhook_max_attempts=3, job_ttl_s=120)


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.delete(KEYS.webhook_schedule, KEYS.webhook_dead)
    return c


@pytest.fixture
def store(client: redis.Redis, cfg: Settings) -> webhooks.DeliveryStore:
    return webhooks.DeliveryStore(
        client, Keys(cfg.redis.key_prefix), cfg.webhooks, job_ttl_s=cfg.jobs.job_ttl_s
    )


def _finished_job(client: redis.Redis) -> str:
    """A done job with a webhook, its first attempt scheduled (as job_finish.lua leaves it)."""
    job_id = uuid.uuid4().hex
    record = jobs.new_record(
        job_id=job_id,
        owner="alice",
        request=JobRequest(
            query="q", top_k=1, mode="retrieval", index="i", webhook_url="https://hooks.example.com/in"
        ),
        now=time.time(),
    )
    client.hset(KEYS.job(job_id), mapping=record.encode())
    tracker = jobs.JobTracker(client, KEYS, job_id, job_ttl_s=120)
    outcome = tracker.finish(KEYS.events(job_id), Done(answer=None), stream_ttl_s=60, maxlen=10)
    assert outcome == "first"
    return job_id


def test_signature_matches_the_documented_recipe() -> None:
    body = b'{"job_id":"abc","status":"done"}'
    timestamp, delivery = str(int(time.time())), "9b2f6c0e8d0b4f51a1a4c3f0e6f8d2aa"
    signature = webhooks.sign("s3cret", timestamp, delivery, body)
    # docs/webhooks.md: HMAC-SHA256 over "<timestamp>.<delivery id>.<raw body>", hex, prefixed "sha256="
    expected = hmac.new(b"s3cret", f"{timestamp}.{delivery}.".encode() + body, hashlib.sha256).hexdigest()
    assert signature == "sha256=" + expected
    assert webhooks.verify("s3cret", timestamp, delivery, body, signature)
    assert not webhooks.verify("other", timestamp, delivery, body, signature)
    assert not webhooks.verify("s3cret", timestamp, delivery, body + b" ", signature)
    old = str(int(time.time()) - 3600)
    assert not webhooks.verify("s3cret", old, delivery, body, webhooks.sign("s3cret", old, delivery, body))


def test_a_captured_delivery_does_not_replay_under_a_fresh_id() -> None:
    """Receivers drop duplicates by X-Ragline-Delivery: a replay that changes it must not verify."""
    body = b'{"job_id":"abc","status":"done"}'
    timestamp = str(int(time.time()))
    signature = webhooks.sign("s3cret", timestamp, "delivery-1", body)
    assert not webhooks.verify("s3cret", timestamp, "delivery-2", body, signature)
    verify = documented_verify()
    headers = {"X-Ragline-Timestamp": timestamp, "X-Ragline-Signature": signature}
    assert verify("s3cret", httpx.Headers({**headers, "X-Ragline-Delivery": "delivery-1"}), body)
    assert not verify("s3cret", httpx.Headers({**headers, "X-Ragline-Delivery": "delivery-2"}), body)


def test_the_recipe_in_the_docs_verifies() -> None:
    verify = documented_verify()
    body = b'{"job_id":"abc","status":"done"}'
    timestamp, delivery = str(int(time.time())), uuid.uuid4().hex
    headers = httpx.Headers(
        {
            "X-Ragline-Timestamp": timestamp,
            "X-Ragline-Delivery": delivery,
            "X-Ragline-Signature": webhooks.sign("s3cret", timestamp, delivery, body),
        }
    )
    assert verify("s3cret", headers, body)
    assert not verify("s3cret", headers, body.replace(b"done", b"fail"))
    assert not verify("other", headers, body)


def test_backoff_grows_is_capped_and_jittered() -> None:
    rng = random.Random(7)
    first = [webhooks.backoff_s(1, base_s=1, max_s=600, rng=rng) for _ in range(200)]
    assert min(first) >= 0.5 and max(first) <= 1.0 and len(set(first)) > 100
    assert all(4 <= webhooks.backoff_s(4, base_s=1, max_s=600, rng=rng) <= 8 for _ in range(50))
    assert all(300 <= webhooks.backoff_s(30, base_s=1, max_s=600, rng=rng) <= 600 for _ in range(50))


def test_per_principal_secret_overrides_the_derived_one(client: redis.Redis) -> None:
    principal = f"key-{uuid.uuid4().hex[:8]}"
    derived = webhooks.derived_secret("default", principal)
    assert webhooks.secret_for(client, KEYS, principal, "default") == derived != "default"
    webhooks.set_secret(client, KEYS, principal, "mine")
    assert webhooks.secret_for(client, KEYS, principal, "default") == "mine"
    assert webhooks.clear_secret(client, KEYS, principal)
    assert webhooks.secret_for(client, KEYS, principal, "default") == derived


@pytest.mark.unit
def test_each_key_without_a_secret_of_its_own_gets_its_own_derived_one() -> None:
    """One tenant's receiver secret cannot sign (forge) a delivery to another's: keys without a
    secret of their own no longer share the deployment's, each gets an HMAC of it and its id, as
    docs/webhooks.md writes it for receivers."""
    deployment = "the-deployment-secret-0123"
    alice, bob = webhooks.derived_secret(deployment, "key_a1"), webhooks.derived_secret(deployment, "key_b2")
    assert len({alice, bob, deployment}) == 3
    assert alice == webhooks.derived_secret(deployment, "key_a1")  # stable: the receiver keeps it
    assert webhooks.derived_secret("another-deployment-secret", "key_a1") != alice
    documented = hmac.new(deployment.encode(), b"ragline-webhook-secret:key_a1", hashlib.sha256).hexdigest()
    assert alice == "whsec_" + documented
    timestamp, delivery, body = str(int(time.time())), "d-1", b'{"job_id": "j"}'
    forged = webhooks.sign(alice, timestamp, delivery, body)  # by alice, for bob's receiver
    assert webhooks.verify(alice, timestamp, delivery, body, forged)
    assert not webhooks.verify(bob, timestamp, delivery, body, forged)


def test_due_attempts_are_leased_until_their_task_claims_them(
    client: redis.Redis, store: webhooks.DeliveryStore
) -> None:
    """A task lost between the poller's push and its claim (a failover right after the push, or
    a worker's pop as Redis died) is sent again: the attempt stays scheduled, leased, until its
    claim removes it."""
    job_id = _finished_job(client)
    due = store.take_due(lease_s=0.3)
    assert [(d.job_id, d.attempt) for d in due] == [(job_id, 1)]
    assert store.take_due(lease_s=0.3) == []  # a second poller does not get it
    time.sleep(0.35)  # enqueued, but no task claimed it: it comes back
    assert [d.job_id for d in store.take_due(lease_s=30)] == [job_id]
    assert store.claim(job_id, 1, lease_s=30) is not None
    assert client.zcard(KEYS.webhook_schedule) == 0
    assert store.claim(job_id, 1, lease_s=30) is None  # the resent duplicate: busy, nothing left
    assert client.zcard(KEYS.webhook_schedule) == 0


def test_retries_then_dead_letter(client: redis.Redis, store: webhooks.DeliveryStore) -> None:
    job_id = _finished_job(client)
    for attempt in (1, 2, 3):
        (due,) = store.take_due()
        assert (due.job_id, due.attempt) == (job_id, attempt)
        record = store.claim(job_id, attempt, lease_s=30)
        assert record is not None and record["id"] == job_id
        assert store.claim(job_id, attempt, lease_s=30) is None  # a duplicate task: busy
        last = {"attempt": attempt, "status_code": 500}
        outcome = store.record(record, attempt, outcome="retry", last=last, next_due=time.time() - 1)
        assert outcome == ("scheduled" if attempt < 3 else "dead")
        assert store.claim(job_id, attempt, lease_s=30) is None  # concluded: stale
    assert store.take_due() == []
    rec = JobRecord.decode(client.hgetall(KEYS.job(job_id)))
    assert rec.delivery_status == "dead" and rec.delivery_attempts == 3
    dead = webhooks.dead_letters(client, KEYS)
    assert dead[0]["job_id"] == job_id and dead[0]["attempts"] == 3
    assert dead[0]["last_attempt"]["status_code"] == 500
    assert store.claim(job_id, 4, lease_s=30) is None
    state = WebhookState.of(rec)
    assert state is not None and state.dead_lettered_at


def test_delivered_and_gone_stop(client: redis.Redis, store: webhooks.DeliveryStore) -> None:
    for outcome in ("delivered", "gone"):
        job_id = _finished_job(client)
        record = store.claim(job_id, 1, lease_s=30)
        assert store.record(record, 1, outcome=outcome, last={"status_code": 200}, next_due=0) == outcome
        assert store.claim(job_id, 1, lease_s=30) is None
        assert store.claim(job_id, 2, lease_s=30) is None
    assert client.zcard(KEYS.webhook_schedule) == 0  # each claim took its attempt off the schedule
    assert webhooks.dead_letters(client, KEYS) == []


def test_a_deferred_attempt_runs_again_without_counting(
    client: redis.Redis, store: webhooks.DeliveryStore
) -> None:
    """Deferred (the resolver or the host's slots were full): the same attempt is due again, the
    attempt count and the last attempt stay as they were, and the max attempts still apply."""
    job_id = _finished_job(client)
    for _ in range(5):  # more deferrals than webhook_max_attempts: none of them counts
        (due,) = store.take_due()
        assert (due.job_id, due.attempt) == (job_id, 1)
        record = store.claim(job_id, 1, lease_s=30)
        assert record is not None
        assert store.record(record, 1, outcome="deferred", last={"error": "x"}, next_due=time.time() - 1) == (
            "deferred"
        )
    rec = JobRecord.decode(client.hgetall(KEYS.job(job_id)))
    assert rec.delivery_attempts == 0 and rec.delivery_status == "scheduled"
    assert rec.delivery_last is None and rec.delivery_deferrals == 5
    assert client.ttl(KEYS.job(job_id)) > 0
    (due,) = store.take_due()
    record = store.claim(job_id, 1, lease_s=30)
    assert store.record(record, 1, outcome="retry", last={"status_code": 500}, next_due=0) == "scheduled"
    assert client.hget(KEYS.job(job_id), "delivery_attempts") == b"1"


def test_a_dead_workers_attempt_is_taken_over(client: redis.Redis, store: webhooks.DeliveryStore) -> None:
    job_id = _finished_job(client)
    crashed = store.claim(job_id, 1, lease_s=0.2)
    assert crashed is not None
    time.sleep(0.25)
    record = store.claim(job_id, 1, lease_s=30)  # the redelivered task, after the lease
    assert record is not None
    assert store.record(record, 1, outcome="delivered", last={}, next_due=0) == "delivered"
    # the crashed worker's late record (if it ever came back) is refused
    assert store.record(crashed, 1, outcome="retry", last={}, next_due=0) == "stale"
    assert json.loads(client.hget(KEYS.job(job_id), "delivery_attempts")) == 1
