"""A task as its body plus hooks, as dramatiq composes middleware: one small object per concern
(``workers/hooks.py``: decoding the payload, queue-wait metrics, job tracking, cancellation,
requeue on a dead engine), so that a task's body is its own logic only.

Each hook may act ``before`` the body, in the order the task lists them, and ``after`` it, in
the reverse order, whatever happened: a hook whose ``before`` ran always gets its ``after``,
which sees the error so far and returns the error that goes on (the same, another, or None when
it dealt with it). A hook or the body ends a task early with :class:`Skip` (acknowledged, nothing
more to do); :class:`RetryLater` asks Celery for a retry. The Celery task is registered as before:
the same name, ``bind=True``, the payload as keyword arguments, and Celery's own exceptions
(``Reject``, ``Retry``) pass through every hook, so its delivery guarantees stay as they were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, Self, TypeVar

import redis
from celery.exceptions import TaskPredicate
from ragline.workers.errors import WorkerError

log = logging.getLogger(__name__)


# Redis out of reach: down, restarting, still loading its data, or failing over (BusyLoadingError
# is a ConnectionError). Nothing is wrong with the task, and what it wrote may be partly lost: it
# goes back to its queue (every task's RequeueOn, hooked_task.py), never fails its request and is
# never acknowledged, which would leave its job unfinished for good.
REDIS_UNREACHABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)


class Payload(Protocol):
    """A task payload of the contract (``broker/contract/messages.py``): it decodes itself from
    the task's keyword arguments and raises ContractError when they break the contract."""

    @classmethod
    def decode(cls, kwargs: Mapping[str, Any]) -> Self: ...


P = TypeVar("P", bound=Payload)


class Skip(WorkerError):
    """Ends the task here, acknowledged: the message is done with (a redelivery, a payload that
    breaks the contract, a job cancelled before it started)."""


class RetryLater(WorkerError):
    """The task should run again in ``countdown_s`` (Celery's retry: the message is acknowledged
    and sent again)."""

    def __init__(self, countdown_s: float) -> None:
        super().__init__(f"retry in {countdown_s:g}s")
        self.countdown_s = countdown_s


class TaskCancelled(WorkerError):
    """The request the task serves was cancelled while it ran (see ``hooks.Cancellation``)."""


class TaskRefused(WorkerError):
    """The request cannot be served as asked; ``status`` (HTTP-like) and the message are what
    its ``error`` event says (see ``hooks.TrackJob``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def passes_through(error: BaseException | None) -> bool:
    """Whether ``error`` is no failure of the task for a hook to handle: none, Celery's own
    control flow (Reject, Retry, Ignore), the wrapper's, or not an Exception at all."""
    return error is None or not isinstance(error, Exception) or isinstance(error, TaskPredicate | RetryLater)


class TaskCall(Generic[P]):
    """One run of a task: what its hooks and body share. The payload is there once the
    ``DecodePayload`` hook (always the first) has run; a hook keeps what it made for this run
    under its own key (:meth:`put`, :meth:`get`), since the same hook objects serve every run,
    on any thread of the pool."""

    def __init__(
        self,
        name: str,
        kwargs: Mapping[str, Any],
        *,
        task_id: str | None = None,
        redelivered: bool = False,
        picked_at: float | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kwargs = kwargs
        self.task_id = task_id
        self.redelivered = redelivered
        self.headers: Mapping[str, Any] = headers or {}  # the message's own (the trace context)
        self.picked_at = time.time() if picked_at is None else picked_at
        self._payload: P | None = None
        self._state: dict[object, Any] = {}

    @property
    def payload(self) -> P:
        if self._payload is None:
            raise RuntimeError(f"{self.name}: the payload is read before it was decoded")
        return self._payload

    @payload.setter
    def payload(self, value: P) -> None:
        self._payload = value

    def put(self, owner: object, value: Any) -> None:
        self._state[owner] = value

    def get(self, owner: object) -> Any:
        return self._state[owner]

    def has(self, owner: object) -> bool:
        return owner in self._state


class Hook(Generic[P]):
    """One concern of a task, around its body; both methods do nothing unless overridden."""

    def before(self, call: TaskCall[P]) -> None:
        """Before the body (and the hooks listed after this one); raise Skip to end the task."""

    def after(self, call: TaskCall[P], error: BaseException | None) -> BaseException | None:
        """After the body (and the hooks listed after this one); returns the error that goes on."""
        return error


Body = Callable[[TaskCall[P]], None]


def run(call: TaskCall[P], hooks: Sequence[Hook[P]], body: Body[P]) -> None:
    """The hooks' ``before`` in order, the body, then the ``after`` of each hook whose ``before``
    ran, in reverse order; raises the error left at the end."""
    entered: list[Hook[P]] = []
    error: BaseException | None = None
    try:
        for hook in hooks:
            hook.before(call)
            entered.append(hook)
        body(call)
    except Skip as skip:
        log.debug("%s task %s skipped: %s", call.name, call.task_id, skip)
    except BaseException as exc:  # every hook entered gets to see it (a lock is released, say)
        error = exc
    for hook in reversed(entered):
        try:
            error = hook.after(call, error)
        except BaseException as exc:  # the hooks before it still get their turn
            exc.__context__ = error
            error = exc
    if error is not None:
        raise error
