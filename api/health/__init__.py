"""Probes (``/healthz``, ``/readyz``), this process's Prometheus metrics (``/metrics``), and the
queues as admission sees them (``/v1/health/queues``)."""
