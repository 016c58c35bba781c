"""A worker holding a task when Redis restarts reconnects and consumes again, on a real
redis-server and a real Celery worker (kombu's own transport made the worker exit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings

from tests.helpers import free_port, redis_server

ROOT = Path(__file__).parents[3]


def _wait_for(client: redis.Redis, marker: bytes, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if marker in client.lrange("test:done", 0, -1):
                return True
        except redis.ConnectionError:
            pass
        time.sleep(0.2)
    return False


@pytest.mark.integration
@pytest.mark.redis  # a redis-server of its own
@pytest.mark.stack  # a Celery worker
@pytest.mark.slow
def test_a_worker_holding_a_task_survives_a_redis_restart(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    app = create_celery(Settings().replace(redis_url=url).redis)
    client = redis.Redis(port=port, socket_timeout=2)
    env = dict(os.environ, RAGLINE_RESTART_TEST_URL=url)
    command = [sys.executable, "-m", "celery", "-A", "tests.broker.restart_app", "worker"]
    command += ["-P", "threads", "-c", "2", "-Q", "retrieval", "--without-gossip", "--without-mingle"]
    worker: subprocess.Popen[bytes] | None = None
    try:
        with redis_server(tmp_path, port=port):
            worker = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            app.send_task("test.hold", args=["warm", 0], queue="retrieval")
            assert _wait_for(client, b"warm", 60), "the worker did not start consuming"
            app.send_task("test.hold", args=["held", 5], queue="retrieval")
            time.sleep(1.5)  # taken, unacknowledged, and its worker busy on it
        with redis_server(tmp_path, port=port):  # the same port: Redis restarted
            time.sleep(2)
            assert worker.poll() is None, "the worker exited when Redis went away"
            app.send_task("test.hold", args=["after", 0], queue="retrieval")
            assert _wait_for(client, b"after", 45), "the worker did not consume after the restart"
            assert worker.poll() is None
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
