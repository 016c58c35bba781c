"""The door, before any route runs: API key (401) and token buckets (429), one Redis round trip.

Sets ``request.state.principal`` (the key's id, or ``anonymous`` when auth is off) for every
route behind it, and the rate-limit headers for the response. Probes, metrics, the docs and the
web page's files pass without a key, and without spending a token.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from fastapi import Request
from ragline.api.web.docs import DOCS_PATHS
from ragline.api.web.router import PAGE_PATHS
from ragline.broker import metrics
from ragline.broker.limits.ratelimit import AuthRateLimiter, Status, Verdict
from ragline.broker.state import apikeys

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"}) | DOCS_PATHS | PAGE_PATHS


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    error: str
    message: str
    headers: dict[str, str]


def rate_headers(verdict: Verdict) -> dict[str, str]:
    if not verdict.limit:
        return {}
    return {"X-RateLimit-Limit": str(verdict.limit), "X-RateLimit-Remaining": str(verdict.remaining)}


class Access:
    def __init__(self, limiter: AuthRateLimiter) -> None:
        self._limiter = limiter

    async def is_admin(self, request: Request) -> bool:
        """Whether ``request`` carries an admin key (with keys off, every request does): what an
        open path shows only to operators. A key presented here is checked, and spends a token,
        as on any other path; one refused for any reason is no admin's."""
        if not self._limiter.requires_key:
            return True
        key = apikeys.presented(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if not key:
            return False
        try:
            verdict = await self._limiter.check(key)
        except Exception as exc:
            log.warning("the API key check could not reach Redis: %r", exc)
            return False
        return verdict.status is Status.ALLOWED and apikeys.ADMIN in verdict.scopes

    async def check(self, request: Request) -> Refusal | Verdict:
        """The verdict for this request, or why it is refused (no queue is touched either way)."""
        if request.url.path in OPEN_PATHS:
            return Verdict(Status.ALLOWED)
        key = apikeys.presented(request.headers.get("authorization"), request.headers.get("x-api-key"))
        try:
            verdict = await self._limiter.check(key)
        except Exception as exc:
            log.warning("the API key check could not reach Redis: %r", exc)
            return Refusal(503, "unavailable", "cannot check the API key right now", {"Retry-After": "1"})
        if verdict.status is Status.UNAUTHENTICATED:
            metrics.REJECTIONS.labels("unauthenticated").inc()
            message = "an API key is required: Authorization: Bearer <key> or X-API-Key: <key>"
            if key:
                message = "unknown or revoked API key"
            return Refusal(401, "unauthenticated", message, {"WWW-Authenticate": "Bearer"})
        if verdict.status is Status.RATE_LIMITED:
            metrics.REJECTIONS.labels("rate_limited").inc()
            retry = max(1, math.ceil(verdict.retry_after_s))
            which = "this API key's" if verdict.scope == "key" else "the server's global"
            return Refusal(
                429,
                "rate_limited",
                f"over {which} rate limit; retry in {verdict.retry_after_s:.2f} s",
                {"Retry-After": str(retry), **rate_headers(verdict)},
            )
        return verdict
