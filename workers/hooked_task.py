"""Registers a task body and its hooks (``workers/task_call.py``) as a Celery task.

The Celery task is what it was before hooks: the same name and queue, ``bind=True``, called with
the payload's keyword arguments (so a task queued by the previous release still decodes), and
whatever the chain raises reaches Celery as it was raised, so ``acks_late``, ``Reject(requeue=
True)`` and ``retry`` keep their meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, Task
from ragline.workers.hooks import DecodePayload, RequeueOn
from ragline.workers.task_call import REDIS_UNREACHABLE, Body, Hook, P, RetryLater, TaskCall, run


def hooked_task(
    app: Celery,
    name: str,
    payload: type[P],
    hooks: Sequence[Hook[P]] = (),
    **options: Any,
) -> Callable[[Body[P]], Task]:
    """Register the decorated body as the Celery task ``name`` (``options`` as ``app.task`` takes
    them): each run decodes its ``payload`` first (:class:`DecodePayload`), then runs ``hooks``
    around the body, and goes back to its queue when Redis was out of reach (its ``after`` last,
    so it sees that error whatever the other hooks did). Returns the Celery task; calling it runs
    the whole chain in-process."""
    chain: tuple[Hook[P], ...] = (DecodePayload(payload), RequeueOn(*REDIS_UNREACHABLE), *hooks)

    def register(body: Body[P]) -> Task:
        def task(self: Task, **kwargs: Any) -> None:
            request = self.request
            call: TaskCall[P] = TaskCall(
                name,
                kwargs,
                task_id=request.id,
                redelivered=bool((request.delivery_info or {}).get("redelivered")),
                headers=request.headers,
            )
            try:
                run(call, chain, body)
            except RetryLater as later:
                raise self.retry(countdown=later.countdown_s) from None

        # Named as the body, so that Celery's logs name it; no __wrapped__ (functools.wraps),
        # which would have Celery check calls against the body's signature instead of **kwargs.
        task.__name__ = task.__qualname__ = body.__name__
        task.__module__, task.__doc__ = body.__module__, body.__doc__
        registered: Task = app.task(name=name, bind=True, **options)(task)
        return registered

    return register
