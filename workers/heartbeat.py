"""Tells the API (readiness) that a live worker consumes a queue, every few seconds."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from broker import liveness
from broker.keys import Keys
from broker.redis_pool import sync_client
from broker.settings import RedisSettings

log = logging.getLogger(__name__)


def install(app: Celery, queue: str, settings: RedisSettings, *, host_defaults: str) -> Callable[[str], None]:
    """Beat from worker_ready (the worker consumes) until worker_shutdown; log ``host_defaults``
    (Settings.host_defaults_line) once then. The beat is for every queue the worker consumes
    (``queue`` when it cannot tell): a retrieval worker may serve shard queues besides, or only.
    Returns what to call once the worker consumes one more queue: it beats for it at once."""
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    keys = Keys(settings.key_prefix)
    stop = threading.Event()
    queues = [queue]

    def run() -> None:
        client = sync_client(settings)
        while not stop.is_set():
            try:
                for q in tuple(queues):  # another thread may add one
                    liveness.beat(client, keys, q, worker_id)
            except Exception:
                log.warning("heartbeat to Redis failed", exc_info=True)
            stop.wait(settings.worker_heartbeat_s)
        try:
            for q in tuple(queues):
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

    def add(queue: str) -> None:
        if queue in queues:
            return
        queues.append(queue)
        # Now, not at the next beat: coordinators leave out a shard whose queue has no heartbeat.
        try:
            liveness.beat(sync_client(settings), keys, queue, worker_id)
        except Exception:
            log.warning("heartbeat to Redis failed", exc_info=True)

    return add
