"""API keys: ``rl_<random>``, shown once at creation and stored only as their SHA-256.

A plain (unsalted, fast) hash is enough here: keys are 256 random bits, so there is nothing to
guess from a leaked digest, and the API must check one on every request. Records live in one
Redis hash (digest -> JSON ``{id, name, created_at, revoked, rate, burst}``) that the door's
Lua script (``token_bucket.lua``) reads in the same round trip as the rate limit.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass

import redis

from broker.keys import Keys

KEY_PREFIX = "rl_"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str  # the principal: what logs, metrics and other features (jobs) see, never the key
    name: str
    created_at: float
    revoked: bool = False
    rate: float | None = None  # tokens per second; None: RAGLINE_KEY_RATE_PER_S
    burst: int | None = None  # bucket capacity; None: RAGLINE_KEY_BURST

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def create(
    client: redis.Redis, keys: Keys, name: str, *, rate: float | None = None, burst: int | None = None
) -> tuple[str, ApiKey]:
    """A new key and its record; the key itself is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = ApiKey(
        id=f"key_{secrets.token_hex(6)}", name=name, created_at=time.time(), rate=rate, burst=burst
    )
    client.hset(keys.api_keys, digest(key), record.to_json())
    return key, record


def list_keys(client: redis.Redis, keys: Keys) -> list[ApiKey]:
    records = [ApiKey(**json.loads(raw)) for raw in client.hgetall(keys.api_keys).values()]
    return sorted(records, key=lambda r: r.created_at)


def revoke(client: redis.Redis, keys: Keys, key_id: str) -> bool:
    """Mark the key with this id revoked (the record stays, for the audit trail); False if unknown."""
    for field, raw in client.hgetall(keys.api_keys).items():
        record = ApiKey(**json.loads(raw))
        if record.id == key_id:
            revoked = ApiKey(**{**asdict(record), "revoked": True})
            client.hset(keys.api_keys, field, revoked.to_json())
            return True
    return False


def presented(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if x_api_key and x_api_key.strip():
        return x_api_key.strip()
    return None
