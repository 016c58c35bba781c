"""Helpers shared by several test files (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis

from broker import jobs
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


def finished_job_record(webhook_url: str, *, owner: str = "carol") -> dict[str, str]:
    """A done retrieval job's record with a webhook, as the callbacks worker claims it."""
    record = jobs.new_record(
        job_id=uuid.uuid4().hex,
        owner=owner,
        request={"query": "q", "top_k": 1, "mode": "retrieval", "index": "i"},
        webhook_url=webhook_url,
        metadata={"a": 1},
        now=time.time(),
    )
    return {**record, "status": "done", "done_at": repr(time.time()), "result": json.dumps({"answer": None})}


@contextlib.contextmanager
def redis_server(tmp_path: Path, *, maxmemory: str = "0") -> Iterator[redis.Redis]:
    """A redis-server of the test's own on a free port (the shared one's config is not ours to
    change), ``maxmemory`` with noeviction as ragline deploys it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("redis-server")
    assert exe, "redis-server is needed (Debian: apt-get install -y redis-server)"
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)]
    server = subprocess.Popen(
        [exe, *args, "--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port, socket_timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield client
    finally:
        server.terminate()
        server.wait(10)


def fill_to(client: redis.Redis, fraction: float) -> None:
    """Plain keys until Redis uses ``fraction`` of its maxmemory (OOM stops it at 1.0)."""
    limit = int(client.config_get("maxmemory")["maxmemory"])
    i = 0
    try:
        while int(client.info("memory")["used_memory"]) < fraction * limit:
            client.set(f"filler:{i}", b"x" * 20_000)
            i += 1
    except redis.exceptions.OutOfMemoryError:
        pass
