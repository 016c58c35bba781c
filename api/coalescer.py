"""Request coalescing: concurrent queries leave the API as one retrieval task.

A query that arrives while nothing is in flight goes at once (a lone query never pays for
batching). Otherwise queries gather for up to the window, or until the batch is full, and go
together: the worker then embeds them in one call and searches them in one call, and the Celery
hop (about 1 ms of CPU on each side) is paid once per batch instead of once per query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Publish = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Coalescer:
    def __init__(self, publish: Publish, *, window_s: float, max_batch: int) -> None:
        self._publish = publish
        self._window_s = window_s
        self._max_batch = max_batch
        self._pending: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight = 0  # queries sent whose retrieval has not answered yet
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def submit(self, item: dict[str, Any]) -> None:
        """Returns once the batch holding ``item`` is published; the caller must ``settle()`` it later."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self._max_batch or (self._in_flight == 0 and self._timer is None):
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window_s, self._flush)
        await future

    def settle(self) -> None:
        """A submitted query got its retrieval answer (or gave up waiting)."""
        self._in_flight = max(0, self._in_flight - 1)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        self._in_flight += len(batch)
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[dict[str, Any], asyncio.Future[None]]]) -> None:
        try:
            await self._publish([item for item, _ in batch])
        except Exception as exc:
            self._in_flight = max(0, self._in_flight - len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)
