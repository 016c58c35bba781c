"""Helpers shared by several test files (fixtures stay in conftest.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from broker.settings import Settings
from tests.conftest import Api, start_api


@contextlib.contextmanager
def api_without_redis(settings: Settings, log: Path) -> Iterator[Api]:
    """A keyed API process whose Redis is gone (nothing listens at its port): every request
    past the probes is refused with 503 and Retry-After, since no key can be checked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cut_off = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0", "auth_enabled": True})
    api = start_api(cut_off, log)
    try:
        yield api
    finally:
        api.proc.stop()
