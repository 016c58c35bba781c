"""The test tiers, read from what each test uses (conftest.py applies them at collection).

A test's tier follows from the fixtures in its closure (``item.fixturenames``: the ones it asks
for and every one those ask for in turn), so a test that asks for ``settings`` (which asks for
``redis_url``) needs Redis without saying so. What a fixture cannot reveal is marked by hand:

- ``redis``: the test database at RAGLINE_TEST_REDIS_URL, or a redis-server of the test's own
  (``tests.helpers.redis_server``: marked by hand).
- ``model``: real model weights loaded in this process (MiniLM, SmolLM2's files or tokenizer),
  or a FAISS index trained here. Its own tier rather than folded into ``slow``: it needs the
  prepared model files, which ``slow`` tests do not.
- ``stack``: workers or API processes (Celery workers, uvicorn, Flower, ``ragline up``).
- ``vllm``: the vLLM engine, in a worker or in this process.
- ``slow``: seconds on its own for another reason (a benchmark run, a process tree, importing
  vLLM, a real timeout waited out); marked by hand.
- ``unit``: none of the above: no Redis, no model, no subprocess stack. ``pytest -m unit``.

Every test that is not ``unit`` but needs Redis, a model, the stack or the engine is also
``integration`` (the older name, kept so that ``-m "not integration"`` still means the same).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import PurePath
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest

TIERS = ("redis", "model", "stack", "vllm", "slow")
UNIT = "unit"
INTEGRATION = "integration"

# The fixtures that do the thing; every fixture that asks for one of these inherits its tiers
# through the closure (``settings`` → ``redis_url``; ``client`` → ``api``; ``test_index`` →
# ``embedder``). Names of fixtures local to a test file are listed only if all of them mean the same.
FIXTURE_TIERS: dict[str, frozenset[str]] = {
    "redis_url": frozenset({"redis"}),
    "prepared_model": frozenset({"model"}),
    "embedder": frozenset({"model"}),
    "workers": frozenset({"stack", "vllm"}),  # one retrieval worker, one generation worker
    "api": frozenset({"stack"}),
    "auth_apis": frozenset({"stack"}),
    "callbacks_worker": frozenset({"stack"}),
    # Local to test files: every ``stack`` starts workers and an API on a database of its own.
    "stack": frozenset({"stack"}),
    "capped": frozenset({"stack"}),  # tests/api/test_caps.py: two API processes
    "shard_workers": frozenset({"stack"}),  # tests/workers/retrieval/test_shards.py
    "coordinator": frozenset({"stack"}),
    "browser": frozenset({"stack", "slow"}),  # chromium and its driver
}

# A unit test must not reach these, whatever marker it carries.
NEVER_IN_UNIT = frozenset(FIXTURE_TIERS)


def inferred(fixturenames: Iterable[str]) -> set[str]:
    """The tiers that a test's fixture closure brings."""
    found: set[str] = set()
    for name in fixturenames:
        found |= FIXTURE_TIERS.get(name, frozenset())
    return found


def classify(item: pytest.Item) -> set[str]:
    """The tier markers to add to ``item``; raises on a contradiction (``unit`` on a test whose
    fixtures reach Redis, a model or the stack, or ``integration`` that names no tier)."""
    explicit = {mark.name for mark in item.iter_markers()}
    fixturenames = list(getattr(item, "fixturenames", ()))
    tiers = inferred(fixturenames) | (explicit & set(TIERS))
    if UNIT in explicit:
        reached = sorted(NEVER_IN_UNIT.intersection(fixturenames))
        if tiers or reached:
            raise pytest.UsageError(
                f"{item.nodeid} is marked unit but uses {', '.join(reached) or 'nothing unit'}"
                f" ({', '.join(sorted(tiers))}): a unit test never touches redis_url, a model or the stack"
            )
    if INTEGRATION in explicit and not tiers:
        raise pytest.UsageError(
            f"{item.nodeid} is marked integration but nothing says what it needs: "
            f"mark it with one of {', '.join(TIERS)}"
        )
    if not tiers:
        return {UNIT} - explicit
    if tiers - {"slow"}:
        tiers.add(INTEGRATION)
    return tiers - explicit


# -- what a unit test may not do, enforced while it runs --------------------------------------

# What starts a stack or a Redis (argv[0]'s name, or ``python -m ragline <command>``).
_STACK_PROGRAMS = frozenset({"redis-server", "celery", "uvicorn", "flower"})
_STACK_COMMANDS = frozenset({"worker", "api", "up", "demo", "flower"})


def _redis_ports(test_redis_url: str) -> frozenset[int]:
    """The ports of the Redis servers a test could reach by mistake: the tests' database, the
    one RAGLINE_REDIS_URL names, and Redis' default (Settings' default URL)."""
    urls = [test_redis_url, os.environ.get("RAGLINE_REDIS_URL", ""), "redis://127.0.0.1:6379/0"]
    return frozenset(urlsplit(url).port or 6379 for url in urls if url)


def _starts_a_stack(args: Any) -> bool:
    argv = [str(a) for a in ([args] if isinstance(args, str | bytes | os.PathLike) else args)]
    if not argv or "--version" in argv:
        return False
    if PurePath(argv[0].split()[0]).name in _STACK_PROGRAMS:
        return True
    module = argv[argv.index("-m") + 1 :] if "-m" in argv else []
    return module[:1] == ["ragline"] and bool(set(module[1:2]) & _STACK_COMMANDS)


def keep_to_unit(monkeypatch: pytest.MonkeyPatch, test_redis_url: str) -> None:
    """While a unit test runs, a connection to a Redis that runs outside it is refused, as if
    none ran (redis-py turns that into its ConnectionError, so a test that passes here passes
    on a machine without Redis); a listener the test opens itself, on another port, still
    answers. Starting a redis-server, a worker or an API fails the test: mark it."""
    from redis import connection as sync_connection
    from redis.asyncio import connection as async_connection

    ports = _redis_ports(test_redis_url)
    refusal = "a unit test reached for Redis (tests/tiers.py): mark it redis"

    def reaches_outside(connection: Any) -> bool:
        return getattr(connection, "port", None) in ports or hasattr(connection, "path")

    def guard_sync(original: Any) -> Any:
        def _connect(self: Any) -> Any:
            if reaches_outside(self):
                raise ConnectionRefusedError(111, refusal)
            return original(self)

        return _connect

    def guard_async(original: Any) -> Any:
        async def _connect(self: Any) -> Any:
            if reaches_outside(self):
                raise ConnectionRefusedError(111, refusal)
            return await original(self)

        return _connect

    for sync_cls in (sync_connection.Connection, sync_connection.UnixDomainSocketConnection):
        monkeypatch.setattr(sync_cls, "_connect", guard_sync(sync_cls._connect))
    for async_cls in (async_connection.Connection, async_connection.UnixDomainSocketConnection):
        monkeypatch.setattr(async_cls, "_connect", guard_async(async_cls._connect))

    popen_init = subprocess.Popen.__init__

    def refuse_stacks(self: subprocess.Popen[Any], args: Sequence[Any] | str, *rest: Any, **kw: Any) -> None:
        if _starts_a_stack(args):
            _fail(f"a unit test started {args!r} (tests/tiers.py): mark it redis or stack")
        popen_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_stacks)


def _fail(message: str) -> NoReturn:
    # pytest.fail raises a BaseException: no ``except Exception`` in the code under test hides it.
    pytest.fail(message, pytrace=False)
