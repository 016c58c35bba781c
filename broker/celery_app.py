"""The Celery app both sides share: queue topology and the delivery guarantees."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue
from ragline.broker.config.settings import RedisSettings, get_settings
from ragline.broker.contract.queues import (
    CALLBACKS_QUEUE,
    DELIVER_WEBHOOK_TASK,
    GENERATE_TASK,
    GENERATION_QUEUE,
    INGEST_QUEUE,
    INGEST_TASK,
    INGEST_TURN_TASK,
    RETRIEVAL_QUEUE,
    RETRIEVE_TASK,
)
from ragline.broker.redis import transport as redis_transport
from ragline.broker.redis.target import parse


def create_celery(settings: RedisSettings | None = None) -> Celery:
    settings = settings or get_settings().redis
    redis_transport.install()  # a worker that holds a task when Redis restarts reconnects
    # The same transport options bound every broker call and tell Redis when to redeliver a task
    # whose worker died (acks_late): Celery reads visibility_timeout from both option dicts.
    transport_options: dict[str, Any] = {
        "visibility_timeout": settings.visibility_timeout_s,
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "global_keyprefix": "",
    }
    target = parse(settings.redis_url, sentinel_password=settings.redis_sentinel_password)
    ssl: dict[str, Any] | None = None
    if target.is_sentinel:
        # kombu's sentinel:// list: it asks each sentinel in turn for master_name's address.
        transport_options["master_name"] = target.master
        transport_options["sentinel_kwargs"] = target.sentinel_kwargs(
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_connect_timeout_s,
        )
        if target.tls:
            ssl = dict(target.tls_options) or {"ssl_cert_reqs": "required"}
    app = Celery("ragline", broker=target.kombu_url(), set_as_current=False)
    if ssl is not None:
        app.conf.broker_use_ssl = ssl
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,  # results travel on the per-request event stream
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # what a worker holds is visible to the monitor as unacked
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        # The third place Celery's Redis docs name ("required to set all of them"): with
        # several apps on one broker the shortest value wins, unset counting as the 1 h default.
        visibility_timeout=settings.visibility_timeout_s,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.redis_connect_timeout_s,
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.2},
        task_queues=[
            Queue(RETRIEVAL_QUEUE),
            Queue(GENERATION_QUEUE),
            Queue(CALLBACKS_QUEUE),
            Queue(INGEST_QUEUE),
        ],
        task_default_queue=RETRIEVAL_QUEUE,
        task_routes={
            RETRIEVE_TASK: {"queue": RETRIEVAL_QUEUE},
            GENERATE_TASK: {"queue": GENERATION_QUEUE},
            DELIVER_WEBHOOK_TASK: {"queue": CALLBACKS_QUEUE},
            INGEST_TASK: {"queue": INGEST_QUEUE},
            INGEST_TURN_TASK: {"queue": INGEST_QUEUE},
        },
        worker_send_task_events=False,  # an event per task costs throughput; Flower still sees workers
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


app = create_celery()
