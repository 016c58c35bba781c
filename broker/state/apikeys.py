"""API keys: ``rl_<random>``, shown once at creation and stored only as their SHA-256.

A plain (unsalted, fast) hash is enough here: keys are 256 random bits, so there is nothing to
guess from a leaked digest, and the API must check one on every request. Records live in one
Redis hash (digest -> JSON ``{id, name, created_at, revoked, rate, burst, scopes}``) that the
door's Lua script (``token_bucket.lua``) reads in the same round trip as the rate limit.

Scopes say what a key may change: ``read`` (query, jobs, list: what every key may do), ``write:NAME``
(also upload to and delete from index NAME), ``admin`` (write to every index). A key recorded
before scopes existed has none, and counts as ``read``: it keeps doing all it ever could, and an
upgrade grants no key the new power to change indexes (``ragline keys scopes ID admin`` does).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import redis
from ragline.broker.redis.keys import Keys
from ragline.broker.state.indexes import InvalidIndexName, check_index_name

KEY_PREFIX = "rl_"
ADMIN = "admin"
READ = "read"
WRITE_PREFIX = "write:"
# What a key recorded without scopes (made before they existed) may do.
LEGACY_SCOPES: tuple[str, ...] = (READ,)
SCOPE_RULE = "admin, read or write:INDEX"


def check_scope(scope: str) -> str:
    """``scope`` when it is one of :data:`SCOPE_RULE`, else ValueError saying why."""
    if scope in (ADMIN, READ):
        return scope
    if scope.startswith(WRITE_PREFIX):
        try:
            check_index_name(scope.removeprefix(WRITE_PREFIX))
        except InvalidIndexName as exc:
            raise ValueError(f"scope {scope!r}: {exc}") from None
        return scope
    raise ValueError(f"unknown scope {scope!r}: use {SCOPE_RULE}")


def may_write(scopes: Iterable[str], index: str) -> bool:
    """Whether a key with ``scopes`` may change ``index`` (upload, delete documents, delete it)."""
    held = set(scopes)
    return ADMIN in held or f"{WRITE_PREFIX}{index}" in held


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
    scopes: list[str] | None = None  # None: recorded before scopes, LEGACY_SCOPES

    @property
    def effective_scopes(self) -> tuple[str, ...]:
        return tuple(self.scopes) if self.scopes is not None else LEGACY_SCOPES

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def create(
    client: redis.Redis,
    keys: Keys,
    name: str,
    *,
    rate: float | None = None,
    burst: int | None = None,
    scopes: Sequence[str] = (READ,),
) -> tuple[str, ApiKey]:
    """A new key and its record; the key itself is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = ApiKey(
        id=f"key_{secrets.token_hex(6)}",
        name=name,
        created_at=time.time(),
        rate=rate,
        burst=burst,
        scopes=sorted({check_scope(s) for s in scopes}),
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


def set_scopes(client: redis.Redis, keys: Keys, key_id: str, scopes: Sequence[str]) -> bool:
    """Give the key with this id exactly ``scopes`` (from its next request on); False if unknown."""
    checked = sorted({check_scope(s) for s in scopes})
    for field, raw in client.hgetall(keys.api_keys).items():
        record = ApiKey(**json.loads(raw))
        if record.id == key_id:
            client.hset(keys.api_keys, field, ApiKey(**{**asdict(record), "scopes": checked}).to_json())
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
