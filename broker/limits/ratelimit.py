"""Authentication and token-bucket rate limits in one atomic Redis script (``token_bucket.lua``).

One bucket per API key (capacity = burst, refilled at rate tokens/s; a key's record may carry its
own) and one global bucket that every request draws from. Both live in Redis, so the limits hold
across any number of API processes; both are checked and debited in the same script, so a request
refused by either takes nothing from the other.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import IntEnum

import redis.asyncio as aioredis
from ragline.broker.config.settings import ApiSettings
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import AsyncStateScript, lua
from ragline.broker.state import apikeys

_SCRIPT = lua(__package__, "token_bucket")


class Status(IntEnum):
    UNAUTHENTICATED = -1
    RATE_LIMITED = 0
    ALLOWED = 1


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    principal: str = "anonymous"
    limit: int = 0  # capacity of the caller's bucket (0: no bucket applied)
    remaining: int = 0  # whole tokens left in it
    retry_after_s: float = 0.0
    scope: str = ""  # the bucket that refused: "key" or "global"
    # What the key may change (broker/state/apikeys.py); with keys off, everything (a local demo).
    scopes: tuple[str, ...] = apikeys.LEGACY_SCOPES


@dataclass(frozen=True, slots=True)
class Limits:
    key_rate: float
    key_burst: int
    global_rate: float
    global_burst: int


class AuthRateLimiter:
    """Who is calling (the API key) and whether they may (the key's and the global token
    buckets), for one request, in one round trip."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        limits: Limits,
        *,
        auth: bool,
        rate_limit: bool,
        timeout_s: float = 1.0,
    ) -> None:
        self._keys = keys
        self._limits = limits
        self._auth = auth
        self._rate_limit = rate_limit
        self._timeout_s = timeout_s
        self._script = AsyncStateScript(client, _SCRIPT)

    @classmethod
    def of(cls, client: aioredis.Redis, keys: Keys, api: ApiSettings) -> AuthRateLimiter:
        """The checks the API settings describe: keys required or not, the default buckets."""
        limits = Limits(api.key_rate_per_s, api.key_burst, api.global_rate_per_s, api.global_burst)
        return cls(client, keys, limits, auth=api.auth_enabled, rate_limit=api.rate_limit_enabled)

    @property
    def requires_key(self) -> bool:
        """Whether a request needs an API key (False: every request is served as an admin's)."""
        return self._auth

    @property
    def needed(self) -> bool:
        """False when nothing is checked at all (no Redis call is made then)."""
        return self._auth or self._rate_limit

    async def check(self, key: str | None, *, cost: int = 1, now_ms: int | None = None) -> Verdict:
        if not self.needed:
            return Verdict(Status.ALLOWED, scopes=(apikeys.ADMIN,))
        if self._auth and not key:
            return Verdict(Status.UNAUTHENTICATED, principal="")
        key_digest = apikeys.digest(key) if self._auth and key else ""
        lim = self._limits
        reply = await asyncio.wait_for(
            self._script(
                keys=[
                    self._keys.api_keys,
                    self._keys.rate_bucket(f"key:{key_digest or 'anonymous'}"),
                    self._keys.rate_bucket("global"),
                ],
                args=[
                    key_digest,
                    lim.key_rate,
                    lim.key_burst,
                    lim.global_rate,
                    lim.global_burst,
                    cost,
                    "1" if self._rate_limit else "0",
                    "" if now_ms is None else now_ms,
                ],
            ),
            self._timeout_s,
        )
        status, principal, limit, remaining, retry_ms, scope, *rest = reply
        return Verdict(
            status=Status(int(status)),
            principal=principal.decode() if isinstance(principal, bytes) else str(principal),
            limit=int(limit),
            remaining=max(0, int(remaining)),
            retry_after_s=int(retry_ms) / 1000,
            scope=scope.decode() if isinstance(scope, bytes) else str(scope),
            scopes=_scopes(rest[0] if rest else b"", auth=self._auth),
        )


def _scopes(raw: bytes | str, *, auth: bool) -> tuple[str, ...]:
    if not auth:
        return (apikeys.ADMIN,)
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    if text == "-":
        return apikeys.LEGACY_SCOPES
    return tuple(text.split())
