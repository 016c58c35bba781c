"""Request coalescing: concurrent queries leave the API as one retrieval task.

A query that arrives while no batch is in flight goes at once (a lone query never pays for
batching). Otherwise queries gather for up to the window, or until the batch is full, and go
together: the worker embeds them in one call and searches them in one call, and the Celery hop
(a fixed CPU cost on each side) is paid once per batch instead of once per query.

While every retrieval worker is busy with a batch, a closed window does not send a small batch
to wait in the Redis queue behind it: the queries stay here and go, more of them together, as
soon as a batch comes back. They would have waited that long in the queue anyway. A hold never
outlasts twice the time batches have recently taken to come back (at least 20 windows, at most
2 s): a batch that never reports back (its worker died) cannot stall the ones behind it, and a
full batch that takes a while does not get its successors split into small ones.

Under load the API turns answers around between batches: it writes a batch's responses, and its
clients' next queries come in, one at a time. Two rules keep the worker busy meanwhile (without
them it idled while a batch turned around, and a one-query batch went first each time because
its client's next query was the first one in):
- a batch is at most a share of the queries in play (pending, in flight, and those of the last
  batch back still being answered): half of them with one worker, a third with two, and so on,
  never less than ``min_split``. One batch is computed while the other turns around; at 64
  clients and one worker that is 32 and 32, with no idle time between them.
- after a batch of several comes back and its answers are out, new queries gather for one
  window before going, instead of the first one going alone. A lone client (its batch held only
  its own query) still goes at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar


class _Query(Protocol):
    @property
    def request_id(self) -> str: ...


Q = TypeVar("Q", bound=_Query)

_PEAK_MEMORY_S = 2.0


class _Batch:
    __slots__ = ("done", "request_ids", "sent_at")

    def __init__(self, request_ids: list[str], sent_at: float) -> None:
        self.request_ids = request_ids
        self.done = False
        self.sent_at = sent_at


class Coalescer(Generic[Q]):
    """Gathers queries (anything with a ``request_id``) into batches for ``publish``."""

    def __init__(
        self,
        publish: Callable[[list[Q]], Awaitable[None]],
        *,
        window_s: float,
        max_batch: int,
        max_in_flight: Callable[[], int] = lambda: 1,
        min_split: int = 16,
    ) -> None:
        self._publish = publish
        self._window_s = window_s
        self._min_hold_s = max(0.05, 20 * window_s)
        self._round_trip_s = 0.0  # EWMA of how long batches take to come back
        self._held_since = 0.0
        self._max_batch = max_batch
        self._min_split = min_split
        self._in_flight_queries = 0
        self._peak_in_play = 0.0
        self._peak_at = 0.0
        self._max_in_flight = max_in_flight
        self._pending: list[tuple[Q, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._window_closed = False
        self._batches_in_flight = 0
        self._batch_of: dict[str, _Batch] = {}
        self._returning: set[str] = set()  # the last batch back: queries not yet answered here
        self._returning_since = 0.0
        self._gather_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def batches_in_flight(self) -> int:
        return self._batches_in_flight

    async def submit(self, item: Q) -> None:
        """Returns once the batch holding ``item`` is published; ``settle(request_id)`` must follow."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self._max_batch or (self._batches_in_flight == 0 and self._quiet()):
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window_s, self._window_expired)
        await future

    def settle(self, request_id: str) -> None:
        """A submitted query got its retrieval answer (or gave up): its batch is back."""
        now = asyncio.get_running_loop().time()
        batch = self._batch_of.pop(request_id, None)
        if batch is not None and not batch.done:
            # The batch's other answers follow; until they are out, new queries gather.
            self._returning = set(batch.request_ids) - {request_id}
            self._returning_since = now
            took = now - batch.sent_at
            self._round_trip_s = took if not self._round_trip_s else 0.8 * self._round_trip_s + 0.2 * took
            self._came_back(batch)
        elif request_id in self._returning:
            self._returning.discard(request_id)
            if not self._returning:  # the last answer of a batch of several is out
                self._gather_until = now + self._window_s

    def _came_back(self, batch: _Batch) -> None:
        batch.done = True
        for other in batch.request_ids:
            self._batch_of.pop(other, None)
        self._batches_in_flight -= 1
        self._in_flight_queries -= len(batch.request_ids)
        if self._pending and (self._window_closed or self._batches_in_flight == 0):
            self._flush()

    def _quiet(self) -> bool:
        """No answers of a batch of several are being written, nor were for a window."""
        now = asyncio.get_running_loop().time()
        if self._returning and now - self._returning_since > self._max_hold_s():
            self._returning.clear()  # an answer nobody read (its client left first): stop waiting
        return not self._returning and now >= self._gather_until

    def _batch_size(self) -> int:
        # Clients whose answers are on their way out, or whose next query is, are in play too but
        # not counted here: the share follows the recent peak (which decays over seconds).
        now = asyncio.get_running_loop().time()
        in_play = len(self._pending) + self._in_flight_queries + len(self._returning)
        decayed = self._peak_in_play * math.exp((self._peak_at - now) / _PEAK_MEMORY_S)
        self._peak_in_play, self._peak_at = max(float(in_play), decayed), now
        share = math.ceil(self._peak_in_play / (max(1, self._max_in_flight()) + 1))
        return min(self._max_batch, max(self._min_split, share))

    def _max_hold_s(self) -> float:
        return min(2.0, max(self._min_hold_s, 2 * self._round_trip_s))

    def _window_expired(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        if not self._window_closed:
            self._held_since = loop.time()
        if (self._batches_in_flight < max(1, self._max_in_flight()) and self._quiet()) or (
            loop.time() - self._held_since >= self._max_hold_s()
        ):
            self._flush()
        else:
            self._window_closed = True  # sent when a batch comes back, or when the hold runs out
            self._timer = loop.call_later(self._window_s, self._window_expired)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._window_closed = False
        size = self._batch_size()
        batch, self._pending = self._pending[:size], self._pending[size:]
        if not batch:
            return
        handle = _Batch([item.request_id for item, _ in batch], asyncio.get_running_loop().time())
        for request_id in handle.request_ids:
            self._batch_of[request_id] = handle
        self._batches_in_flight += 1
        self._in_flight_queries += len(batch)
        # Called here, not in the task: a publisher that can write at once does (see QueuePusher).
        try:
            sent: Awaitable[None] = self._publish([item for item, _ in batch])
        except Exception as exc:
            sent = _failed(exc)
        task = asyncio.get_running_loop().create_task(self._send(handle, batch, sent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._pending:  # more than one batch's share was waiting
            self._timer = asyncio.get_running_loop().call_later(self._window_s, self._window_expired)

    async def _send(
        self, handle: _Batch, batch: list[tuple[Q, asyncio.Future[None]]], sent: Awaitable[None]
    ) -> None:
        try:
            await sent
        except Exception as exc:
            if not handle.done:
                self._came_back(handle)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)


async def _failed(exc: Exception) -> None:
    raise exc
