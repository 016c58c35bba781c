"""API keys and the limiter's token buckets on a real Redis (one Lua script, one round trip)."""

from __future__ import annotations

import asyncio
import json
import uuid

import redis
import redis.asyncio as aioredis
from ragline.broker.limits.ratelimit import AuthRateLimiter, Limits, Status, Verdict
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys


def _keys() -> Keys:
    return Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")


def _limiter(
    redis_url: str, keys: Keys, limits: Limits, *, auth: bool = True, rate_limit: bool = True
) -> AuthRateLimiter:
    return AuthRateLimiter(aioredis.Redis.from_url(redis_url), keys, limits, auth=auth, rate_limit=rate_limit)


def _run(limiter: AuthRateLimiter, calls: list[tuple[str | None, int]]) -> list[Verdict]:
    async def go() -> list[Verdict]:
        return [await limiter.check(key, now_ms=now) for key, now in calls]

    return asyncio.run(go())


def test_keys_are_stored_hashed_and_revocable(redis_url: str) -> None:
    keys = _keys()
    sync = redis.Redis.from_url(redis_url)
    key, record = apikeys.create(sync, keys, "alice", rate=5, burst=7)
    assert key.startswith("rl_") and len(key) > 40
    stored = sync.hgetall(keys.api_keys)
    assert list(stored) == [apikeys.digest(key).encode()]
    assert key.encode() not in b"".join(stored.values())
    assert json.loads(stored[apikeys.digest(key).encode()])["name"] == "alice"
    assert [r.id for r in apikeys.list_keys(sync, keys)] == [record.id]
    assert apikeys.revoke(sync, keys, record.id)
    assert not apikeys.revoke(sync, keys, "key_nope")
    assert apikeys.list_keys(sync, keys)[0].revoked


def test_presented_key_from_either_header() -> None:
    assert apikeys.presented("Bearer rl_a", None) == "rl_a"
    assert apikeys.presented("bearer  rl_a ", None) == "rl_a"
    assert apikeys.presented(None, "rl_b") == "rl_b"
    assert apikeys.presented("Basic abc", None) is None
    assert apikeys.presented(None, None) is None


def test_unknown_missing_and_revoked_keys_are_refused(redis_url: str) -> None:
    keys = _keys()
    sync = redis.Redis.from_url(redis_url)
    key, record = apikeys.create(sync, keys, "bob")
    limiter = _limiter(redis_url, keys, Limits(10, 10, 0, 0))
    ok, missing, wrong = _run(limiter, [(key, 0), (None, 0), ("rl_guess", 0)])
    assert (ok.status, ok.principal) == (Status.ALLOWED, record.id)
    assert missing.status is Status.UNAUTHENTICATED and wrong.status is Status.UNAUTHENTICATED
    apikeys.revoke(sync, keys, record.id)
    limiter = _limiter(redis_url, keys, Limits(10, 10, 0, 0))  # a client per event loop
    assert _run(limiter, [(key, 0)])[0].status is Status.UNAUTHENTICATED


def test_bucket_allows_a_burst_then_refills_at_the_keys_rate(redis_url: str) -> None:
    keys = _keys()
    key, _ = apikeys.create(redis.Redis.from_url(redis_url), keys, "carol", rate=2, burst=3)
    limiter = _limiter(redis_url, keys, Limits(100, 100, 0, 0))  # the key's own rate/burst win
    v = _run(limiter, [(key, 1000)] * 4 + [(key, 1499), (key, 1500), (key, 1500)])
    assert [x.status for x in v] == [1, 1, 1, 0, 0, 1, 0]
    assert [x.remaining for x in v[:3]] == [2, 1, 0]
    assert all(x.limit == 3 for x in v)
    assert v[3].retry_after_s == 0.5 and v[3].scope == "key"
    assert 0 < v[4].retry_after_s <= 0.002  # 1 ms, give or take float rounding


def test_default_limits_apply_to_keys_without_their_own(redis_url: str) -> None:
    keys = _keys()
    key, _ = apikeys.create(redis.Redis.from_url(redis_url), keys, "dave")
    limiter = _limiter(redis_url, keys, Limits(1, 2, 0, 0))
    assert [x.status for x in _run(limiter, [(key, 0)] * 3)] == [1, 1, 0]


def test_global_bucket_holds_across_processes_and_refusals_cost_nothing(redis_url: str) -> None:
    keys = _keys()
    sync = redis.Redis.from_url(redis_url)
    a, _ = apikeys.create(sync, keys, "a", rate=100, burst=100)
    b, _ = apikeys.create(sync, keys, "b", rate=100, burst=2)
    limits = Limits(100, 100, global_rate=1, global_burst=4)
    # Two API processes: two limiters, two connections, one Redis.
    v = _run(_limiter(redis_url, keys, limits), [(a, 0), (b, 0)])
    v += _run(_limiter(redis_url, keys, limits), [(b, 0), (b, 0), (a, 0), (a, 0)])
    # b's own bucket (2) refuses its third call; that refusal takes no global token, so a gets it.
    assert [x.status for x in v] == [1, 1, 1, 0, 1, 0]
    assert v[3].scope == "key" and v[5].scope == "global"
    assert v[5].retry_after_s == 1.0


def test_auth_off_applies_only_the_global_bucket(redis_url: str) -> None:
    keys = _keys()
    limiter = _limiter(redis_url, keys, Limits(1, 1, global_rate=10, global_burst=3), auth=False)
    v = _run(limiter, [(None, 0)] * 4)
    assert [x.status for x in v] == [1, 1, 1, 0]
    assert {x.principal for x in v} == {"anonymous"}
    assert v[0].limit == 3 and v[3].scope == "global"


def test_nothing_to_check_makes_no_redis_call() -> None:
    limiter = AuthRateLimiter(
        aioredis.Redis.from_url("redis://127.0.0.1:1/0"),  # nothing listens there
        Keys(),
        Limits(1, 1, 1, 1),
        auth=False,
        rate_limit=False,
    )
    assert not limiter.needed
    assert asyncio.run(limiter.check(None)).status is Status.ALLOWED
