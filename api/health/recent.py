"""A value computed at most once per interval, whoever asks: what the probes and /metrics read
from Redis without a key, so that asking often costs no more Redis round trips than asking once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Recent(Generic[T]):
    """``compute()``'s last value while it is younger than ``max_age_s``; past that, the next
    caller computes it again and every caller meanwhile waits for that one computation."""

    def __init__(self, compute: Callable[[], Awaitable[T]], *, max_age_s: float) -> None:
        self._compute = compute
        self._max_age_s = max_age_s
        self._value: T | None = None
        self._at = -float("inf")
        self._pending: asyncio.Future[T] | None = None

    async def get(self) -> T:
        if self._value is not None and time.monotonic() - self._at < self._max_age_s:
            return self._value
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._refresh())
        # One caller leaving (a closed connection) does not cancel the others' computation.
        return await asyncio.shield(self._pending)

    async def _refresh(self) -> T:
        try:
            value = await self._compute()
            self._value, self._at = value, time.monotonic()
            return value
        finally:
            self._pending = None
