"""A Celery app built as ragline builds its own, with one task that holds its worker a while:
the worker of tests/broker/redis/test_redis_transport.py."""

from __future__ import annotations

import os
import time

import redis
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings

URL = os.environ["RAGLINE_RESTART_TEST_URL"]
app = create_celery(Settings().replace(redis_url=URL).redis)


@app.task(name="test.hold")
def hold(marker: str, seconds: float) -> None:
    time.sleep(seconds)
    redis.Redis.from_url(URL, socket_timeout=5).rpush("test:done", marker)
