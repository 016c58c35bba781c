"""Accepted means replicated: a durable write is followed, on one connection, by a write and a
WAIT; too few replicas in time is NotReplicated, which the API answers with 503 + Retry-After.
(The one narrow fake: a pipeline that records what it is sent. The same on a real Sentinel set:
tests/broker/redis/test_sentinel.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ragline.api.errors import api_error
from ragline.broker.redis.durability import NO_WAIT, NotReplicated, Replication

pytestmark = pytest.mark.unit


class _Pipeline:
    def __init__(self, acked: int, sent: list[tuple[Any, ...]]) -> None:
        self.acked, self.sent = acked, sent

    def expire(self, key: str, ttl_s: int) -> None:
        self.sent.append(("EXPIRE", key, ttl_s))

    def wait(self, replicas: int, timeout_ms: int) -> None:
        self.sent.append(("WAIT", replicas, timeout_ms))

    def execute(self) -> list[int]:
        return [1, self.acked]


class _Client:
    """A Redis whose WAIT answers ``acked``; it records the pipelines it is asked for."""

    def __init__(self, acked: int) -> None:
        self.acked = acked
        self.pipelines: list[list[tuple[Any, ...]]] = []

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        assert transaction is False  # WAIT inside MULTI returns at once
        self.pipelines.append([])
        return _Pipeline(self.acked, self.pipelines[-1])


class _AsyncPipeline(_Pipeline):
    async def execute(self) -> list[int]:  # type: ignore[override]
        return [1, self.acked]


class _AsyncClient(_Client):
    def pipeline(self, transaction: bool = True) -> _AsyncPipeline:
        assert transaction is False
        self.pipelines.append([])
        return _AsyncPipeline(self.acked, self.pipelines[-1])


def test_a_confirmed_write_is_a_write_then_wait_on_one_connection() -> None:
    client = _Client(acked=1)
    Replication(1, 250).confirm(client, "ragline:job:a", 3600)  # type: ignore[arg-type]
    assert client.pipelines == [[("EXPIRE", "ragline:job:a", 3600), ("WAIT", 1, 250)]]


def test_too_few_replicas_in_time_is_not_replicated_sync_and_async() -> None:
    with pytest.raises(NotReplicated, match="0 of 2 Redis replicas"):
        Replication(2, 100).confirm(_Client(acked=0), "k", 60)  # type: ignore[arg-type]
    with pytest.raises(NotReplicated, match="1 of 2"):
        asyncio.run(Replication(2, 100).aconfirm(_AsyncClient(acked=1), "k", 60))  # type: ignore[arg-type]
    asyncio.run(Replication(1, 100).aconfirm(_AsyncClient(acked=2), "k", 60))  # type: ignore[arg-type]


def test_off_sends_nothing() -> None:
    client = _Client(acked=0)
    NO_WAIT.confirm(client, "k", 60)  # type: ignore[arg-type]
    Replication(0, 1000).confirm(client, "k", 60)  # type: ignore[arg-type]
    assert client.pipelines == []


def test_the_api_refuses_an_unreplicated_job_with_503_and_retry_after() -> None:
    error = api_error(NotReplicated(0, 1, 1000))
    assert (error.status, error.error) == (503, "unavailable")
    assert error.headers["Retry-After"] == "1"
    assert "replica" in error.message
