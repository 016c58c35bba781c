"""How long a finished stream lives, read once per worker process (near Redis' memory limit: briefly)."""

from __future__ import annotations

from functools import cache

from ragline.broker.config.settings import get_settings
from ragline.broker.redis.pool import sync_client
from ragline.broker.streams.events import FinishedStreamTtl


@cache
def finished_ttl() -> FinishedStreamTtl:
    settings = get_settings()
    return FinishedStreamTtl.of(
        sync_client(settings.redis),
        settings.redis,
        max_memory_fraction=settings.retrieval.cache_write_max_memory_fraction,
    )
