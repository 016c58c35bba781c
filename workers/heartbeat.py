"""Tells the API (readiness) that a live worker consumes a queue, every few seconds."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from broker import liveness
from broker.keys import Keys
from broker.redis_pool import sync_client
from broker.settings import RedisSettings

log = logging.getLogger(__name__)


def install(app: Celery, queue: str, settings: RedisSettings, *, host_defaults: str) -> None:
    """Beat from worker_ready (the worker consumes) until worker_shutdown; log ``host_defaults``
    (Settings.host_defaults_line) once then. The beat is for every queue the worker consumes
    (``queue`` when it cannot tell): a retrieval worker may serve shard queues besides, or only."""
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    keys = Keys(settings.key_prefix)
    stop = threading.Event()
    queues = [queue]

    def run() -> None:
        client = sync_client(settings)
        while not stop.is_set():
            try:
                for q in queues:
                    liveness.beat(client, keys, q, worker_id)
            except Exception:
                log.warning("heartbeat to Redis failed", exc_info=True)
            stop.wait(settings.worker_heartbeat_s)
        try:
            for q in queues:
                liveness.leave(client, keys, q, worker_id)
        except Exception:
            log.warning("could not remove heartbeat", exc_info=True)

    thread = threading.Thread(target=run, name=f"heartbeat-{queue}", daemon=True)

    @worker_ready.connect(weak=False)
    def _start(sender: Any = None, **_: object) -> None:
        consumed = [q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", None) or ()]
        if consumed:
            queues[:] = consumed
        # Logged here, not at worker_init: only by now has Celery set up the worker's logging.
        log.info("%s worker: %s", ",".join(queues), host_defaults)
        thread.start()

    @worker_shutdown.connect(weak=False)
    def _stop(**_: object) -> None:
        stop.set()
        if thread.is_alive():
            thread.join(2)
