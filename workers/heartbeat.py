"""Tells the API (readiness) that a live worker consumes a queue, every few seconds."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence

from ragline.broker.config.settings import RedisSettings
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import liveness

log = logging.getLogger(__name__)


class Heartbeat:
    """Beats for every queue the worker consumes (``queue`` until it is told which): a retrieval
    worker may serve shard queues besides, or only. Started once the worker consumes, stopped
    when it shuts down (``workers/bootstrap.py``)."""

    def __init__(self, queue: str, settings: RedisSettings, *, tag: str = "") -> None:
        """``tag`` ends the worker's id (``host:pid:gpu2``): which of a host's engines it is."""
        self._settings = settings
        self._keys = Keys(settings.key_prefix)
        self._worker_id = f"{socket.gethostname()}:{os.getpid()}" + (f":{tag}" if tag else "")
        self._stop = threading.Event()
        self._queues = [queue]
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{queue}", daemon=True)

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(self._queues)

    def start(self, consumed: Sequence[str] = ()) -> None:
        if consumed:
            self._queues[:] = consumed
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)

    def add(self, queue: str) -> None:
        """The worker consumes one more queue: beat for it from now on, the first time at once
        (coordinators leave out a shard whose queue has no heartbeat)."""
        if queue in self._queues:
            return
        self._queues.append(queue)
        try:
            liveness.beat(sync_client(self._settings), self._keys, queue, self._worker_id)
        except Exception:
            log.warning("heartbeat to Redis failed", exc_info=True)

    def _run(self) -> None:
        client = sync_client(self._settings)
        while not self._stop.is_set():
            try:
                for q in self.queues:  # another thread may add one
                    liveness.beat(client, self._keys, q, self._worker_id)
            except Exception:
                log.warning("heartbeat to Redis failed", exc_info=True)
            self._stop.wait(self._settings.worker_heartbeat_s)
        try:
            for q in self.queues:
                liveness.leave(client, self._keys, q, self._worker_id)
        except Exception:
            log.warning("could not remove heartbeat", exc_info=True)
