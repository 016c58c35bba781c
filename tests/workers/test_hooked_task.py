"""A hooked task is the Celery task it was: registered under its name, bound, called with the
payload's keyword arguments, Celery's semantics from the shared app; run in-process here."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Reject, Retry
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import RedisSettings
from ragline.broker.contract.messages import WebhookDelivery
from ragline.broker.contract.queues import (
    DELIVER_WEBHOOK_TASK,
    GENERATE_TASK,
    INGEST_TASK,
    RETRIEVE_TASK,
    SEARCH_SHARD_TASK,
)
from ragline.workers.hooked_task import hooked_task
from ragline.workers.task_call import Hook, RetryLater, TaskCall


@pytest.fixture
def app() -> Celery:
    return create_celery(RedisSettings())


def test_the_body_runs_with_its_decoded_payload_and_the_tasks_request(app: Celery) -> None:
    seen: list[TaskCall[WebhookDelivery]] = []

    @hooked_task(app, "ragline.test_deliver", WebhookDelivery)
    def deliver(call: TaskCall[WebhookDelivery]) -> None:
        """A docstring Celery shows."""
        seen.append(call)

    assert app.tasks["ragline.test_deliver"] is deliver._get_current_object()
    assert deliver.__doc__ == "A docstring Celery shows." and deliver.__name__ == "deliver"
    deliver.apply(kwargs={"job_id": "j1", "attempt": 3}, task_id="task-1").get()
    [call] = seen
    assert call.payload == WebhookDelivery(job_id="j1", attempt=3)
    assert (call.name, call.task_id, call.redelivered) == ("ragline.test_deliver", "task-1", False)


def test_hooks_run_in_the_order_given_after_the_decode(app: Celery) -> None:
    order: list[str] = []

    class Named(Hook[WebhookDelivery]):
        def __init__(self, name: str) -> None:
            self.name = name

        def before(self, call: TaskCall[WebhookDelivery]) -> None:
            order.append(f"{self.name}:{call.payload.attempt}")  # decoded by now

    @hooked_task(app, "ragline.test_order", WebhookDelivery, [Named("a"), Named("b")])
    def body(call: TaskCall[WebhookDelivery]) -> None:
        order.append("body")

    body(job_id="j1", attempt=1)  # called directly, as tests/workers/test_task_contract.py does
    assert order == ["a:1", "b:1", "body"]


def test_retry_later_is_celerys_retry_with_its_options(app: Celery) -> None:
    @hooked_task(app, "ragline.test_retry", WebhookDelivery, max_retries=None)
    def locked(call: TaskCall[WebhookDelivery]) -> None:
        raise RetryLater(1.5)

    assert locked.max_retries is None
    with pytest.raises(Retry):
        locked(job_id="j1", attempt=1)


@pytest.mark.parametrize(
    ("module", "attribute", "name"),
    [
        ("ragline.workers.retrieval.app", "retrieve", RETRIEVE_TASK),
        ("ragline.workers.retrieval.app", "search_shard", SEARCH_SHARD_TASK),
        ("ragline.workers.generation.app", "generate", GENERATE_TASK),
        ("ragline.workers.ingest.app", "ingest", INGEST_TASK),
        ("ragline.workers.callbacks", "deliver_webhook", DELIVER_WEBHOOK_TASK),
    ],
)
def test_each_workers_task_keeps_its_name_and_celerys_guarantees(
    module: str, attribute: str, name: str
) -> None:
    loaded: Any = importlib.import_module(module)
    task = getattr(loaded, attribute)
    assert task.name == name and loaded.app.tasks[name] is task._get_current_object()
    assert task.acks_late and task.reject_on_worker_lost and task.ignore_result
    assert loaded.app.conf.task_serializer == "json" and loaded.app.conf.accept_content == ["json"]
    if name == INGEST_TASK:
        assert task.max_retries is None  # a locked index waits its turn however long


@pytest.mark.parametrize(
    "lost", [redis.ConnectionError("Connection refused"), redis.TimeoutError("Timeout reading")]
)
def test_a_task_that_lost_redis_goes_back_to_its_queue(app: Celery, lost: Exception) -> None:
    # Acknowledged instead (Celery's acks_late on a failure), a batch whose worker lost Redis
    # before it moved its jobs on left them queued for good.
    @hooked_task(app, f"ragline.test_lost_{type(lost).__name__}", WebhookDelivery)
    def body(call: TaskCall[WebhookDelivery]) -> None:
        raise lost

    with pytest.raises(Reject) as raised:
        body.run(job_id="j1", attempt=1)
    assert raised.value.requeue and raised.value.__cause__ is lost
