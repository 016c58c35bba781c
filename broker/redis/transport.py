"""kombu's Redis transport, with one fix: a worker survives Redis going away mid-task.

When the broker connection drops, Celery's consumer first collects the connection (which
detaches its transport) and then closes it; closing the channel restores the messages still
unacknowledged, and with the transport detached the restore finds no connection parameters and
raises ``AttributeError`` (``'NoneType' object has no attribute 'hostname'``). Celery treats
that as unrecoverable and the worker exits: every worker that held a task when Redis restarted
(a generation worker nearly always does) was lost, and its engine with it. Here the same
situation raises a connection error, which Celery ignores while closing; it then reconnects,
and the unacknowledged messages come back by the visibility timeout (``task_acks_late``).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:  # the transport was detached by collect()
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous)  # type: ignore[no-untyped-call]  # kombu's, unannotated


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (``sentinel://``, the primary found through the sentinels) with
    the same fix: a failover is exactly a broker connection dropped mid-task."""

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous)  # type: ignore[no-untyped-call]  # kombu's, unannotated


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def install() -> None:
    """Make ``redis://`` and ``sentinel://`` URLs select these transports in this process. Under
    their own scheme names the broker URL would change, and Flower picks its broker client by the
    URL's scheme."""
    kombu_transports.TRANSPORT_ALIASES["redis"] = f"{__name__}:Transport"
    kombu_transports.TRANSPORT_ALIASES["sentinel"] = f"{__name__}:SentinelTransport"
    for name in ("redis", "sentinel"):  # resolved before, by kombu's own name
        kombu_transports._transport_cache.pop(name, None)
