"""Each worker serves its own Prometheus metrics (one process per pod: no multiprocess mode)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from ragline.broker.config.settings import RedisSettings

log = logging.getLogger(__name__)


class Labelled(Collector):
    """Every metric of ``source`` with ``labels`` added to each sample: one engine's worker among
    several on a host (``gpu="2"``) tells its series apart without every metric declaring it."""

    def __init__(self, source: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self._source = source
        self._labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**s.labels, **self._labels}) for s in family.samples]
            yield labelled


def serve(settings: RedisSettings, labels: Mapping[str, str] | None = None) -> None:
    """Serve /metrics on RAGLINE_WORKER_METRICS_PORT (none when it is unset), every sample with
    ``labels``. Called once the worker consumes: probes read it as "ready", the engine or index is
    loaded by then."""
    if not settings.worker_metrics_port:
        return
    registry = REGISTRY
    if labels:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Labelled(REGISTRY, labels))
    start_http_server(settings.worker_metrics_port, addr=settings.worker_metrics_host, registry=registry)
    log.info("metrics on %s:%d", settings.worker_metrics_host, settings.worker_metrics_port)
