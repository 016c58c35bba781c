"""The contract between the API and the workers, grouped by concern:

- ``contract/``: the wire format (typed task payloads and stream events; queue and task names);
- ``config/``: the one ``Settings`` and the host's defaults;
- ``redis/``: clients, key names, the Lua loader, the Celery transport;
- ``streams/``: per-request event streams;
- ``limits/``: buckets, leases, backpressure, the SSRF guard;
- ``state/``: jobs, webhooks, keys, indexes, shards, caches, heartbeats;
- ``tracing/``: OpenTelemetry traces, and their context in task headers.

Imports neither ``ragline.api`` nor ``ragline.workers``.
"""
