"""One start for every worker app (retrieval, generation, ingest, callbacks).

``bootstrap`` builds what each of them needs the same way: the Celery app of the broker's
contract (``create_celery``), the heartbeat that tells readiness it consumes its queue, its
Prometheus metrics, and one log line of the settings filled from the host; and it ties the app's
own parts to the worker's life, in this order:

- ``init`` (Celery's ``worker_init``): before the worker consumes; tracing first (when
  ``settings.telemetry`` turns it on, ``broker/tracing``), then a warm-up, the engine's start.
- ``ready`` (``worker_ready``): it consumes now. The metrics are served and the heartbeat starts
  first, then the host-defaults line (only by now has Celery set up the worker's logging), then
  the app's own.
- ``stopping`` (``worker_shutting_down``): on SIGTERM/SIGINT, before the pool waits for its tasks.
- ``shutdown`` (``worker_shutdown``): the heartbeat stops first (readiness drops at once), then
  the app's own, an engine's shutdown say, and tracing last (what is left is exported).

Each part is a receiver of its own, as Celery calls them: one that raises is logged and the next
still runs, and SystemExit (which Celery does not catch) ends the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, signals
from celery.utils.dispatch import Signal
from ragline.broker import tracing
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings, get_settings
from ragline.broker.redis.keys import Keys
from ragline.workers import metrics_server
from ragline.workers.heartbeat import Heartbeat

log = logging.getLogger(__name__)

Step = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """The worker signals parts are tied to: Celery's, or a test's own."""

    init: Signal = signals.worker_init
    ready: Signal = signals.worker_ready
    stopping: Signal = signals.worker_shutting_down
    shutdown: Signal = signals.worker_shutdown


@dataclass(frozen=True, slots=True)
class Worker:
    """What a worker app module is built on."""

    app: Celery
    settings: Settings
    keys: Keys
    heartbeat: Heartbeat


def bootstrap(
    queue: str,
    settings: Settings | None = None,
    *,
    init: Sequence[Step] = (),
    ready: Sequence[Step] = (),
    stopping: Sequence[Step] = (),
    shutdown: Sequence[Step] = (),
    lifecycle: Lifecycle | None = None,
    labels: Mapping[str, str] | None = None,
) -> Worker:
    """The worker of ``queue``: its app, with the app's own parts (each step called with no
    arguments) tied to the worker's life in the order the module says. ``labels`` tell this
    worker from its siblings on one host (one engine per GPU: ``{"gpu": "2"}``): on every metric
    it serves, and in its heartbeat's id."""
    settings = settings or get_settings()
    lifecycle = lifecycle or Lifecycle()
    labels = dict(labels or {})
    app = create_celery(settings.redis)
    heartbeat = Heartbeat(queue, settings.redis, tag="".join(f"{k}{v}" for k, v in labels.items()))

    def start(sender: Any = None, **_: object) -> None:
        metrics_server.serve(settings.redis, labels)
        heartbeat.start(consumed_queues(sender))
        log.info("%s worker: %s", ",".join(heartbeat.queues), settings.host_defaults_line())

    def stop(**_: object) -> None:
        heartbeat.stop()

    def trace(**_: object) -> None:
        tracing.configure(settings.telemetry, f"ragline-{queue}")

    def stop_tracing(**_: object) -> None:
        tracing.shutdown()  # last: exports the spans of the tasks that finished while it stopped

    lifecycle.init.connect(trace, weak=False)
    _connect(lifecycle.init, init)
    lifecycle.ready.connect(start, weak=False)
    _connect(lifecycle.ready, ready)
    _connect(lifecycle.stopping, stopping)
    lifecycle.shutdown.connect(stop, weak=False)
    _connect(lifecycle.shutdown, shutdown)
    lifecycle.shutdown.connect(stop_tracing, weak=False)
    return Worker(app=app, settings=settings, keys=Keys(settings.redis.key_prefix), heartbeat=heartbeat)


def consumed_queues(consumer: Any) -> list[str]:
    """The queues a worker consumes, from ``worker_ready``'s sender (its consumer); none when it
    cannot tell."""
    task_consumer = getattr(consumer, "task_consumer", None)
    return [q.name for q in getattr(task_consumer, "queues", None) or ()]


def _connect(signal: Signal, steps: Sequence[Step]) -> None:
    for step in steps:
        signal.connect(_receiver(step), weak=False)


def _receiver(step: Step) -> Callable[..., None]:
    def receive(**_: object) -> None:
        step()

    # Celery logs a receiver that raises by its repr: the step's name tells which part it was.
    receive.__name__ = receive.__qualname__ = getattr(step, "__name__", repr(step))
    return receive
