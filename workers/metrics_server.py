"""Each worker serves its own Prometheus metrics (one process per pod: no multiprocess mode)."""

from __future__ import annotations

import logging

from celery.signals import worker_ready
from prometheus_client import start_http_server

from broker.settings import RedisSettings

log = logging.getLogger(__name__)


def install(settings: RedisSettings) -> None:
    """Serve /metrics on RAGLINE_WORKER_METRICS_PORT from the moment the worker consumes
    (probes read it as "ready": the engine or index is loaded by then)."""
    if not settings.worker_metrics_port:
        return

    @worker_ready.connect(weak=False)
    def _serve(**_: object) -> None:
        start_http_server(settings.worker_metrics_port, addr=settings.worker_metrics_host)
        log.info("metrics on %s:%d", settings.worker_metrics_host, settings.worker_metrics_port)
