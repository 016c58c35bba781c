"""A Redis that goes away in the middle of a request: the JSON answer is a 503 with Retry-After and
a message that says so, the stream (already 200) ends with an `error` event saying the same, and
a request after it is a 503 too; never a 500 with an exception's repr. A real API process on a
real redis-server of its own, SIGKILLed while both requests wait on it for their events."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes

from ragline import processes
from tests.helpers import free_port, parse_sse, start_api

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def redis_server(home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    command = processes.embedded_redis_command(home, port)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 15
        while not processes.redis_answers(url):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        yield url, server
    finally:
        server.kill()
        server.wait(10)


def _waiting_readers(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c.get("cmd") == "xread")


def test_redis_lost_mid_request_is_503_with_retry_after(settings: Settings, tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as (url, server):
        s = settings.replace(redis_url=url, redis_socket_timeout_s=2.0)
        client = redis.Redis.from_url(url)
        # An index, and no worker on this Redis: each request waits for events that never come.
        indexes.register(
            client,
            Keys(s.redis.key_prefix),
            indexes.IndexInfo(name="test", version="v1", path="/nowhere", chunks=1, dim=384),
        )
        api = start_api(s, tmp_path / "api.log")
        try:
            with httpx.Client(base_url=api.base, timeout=60) as http, ThreadPoolExecutor(2) as pool:

                def stream() -> tuple[int, list[tuple[str | None, str, dict]]]:
                    body = {"query": "When does the café open?", "mode": "retrieval"}
                    with http.stream("POST", "/v1/query/stream", json=body) as r:
                        return r.status_code, list(parse_sse(r.iter_lines()))

                asked = pool.submit(http.post, "/v1/query", json={"query": "Who bakes the buns?"})
                streamed = pool.submit(stream)
                deadline = time.monotonic() + 30
                while _waiting_readers(client) < 2:
                    assert time.monotonic() < deadline, "the requests never waited on their events"
                    time.sleep(0.05)
                server.kill()
                server.wait(10)

                reply = asked.result(timeout=60)
                assert reply.status_code == 503, reply.text
                assert reply.headers["Retry-After"] == "1"
                body = reply.json()
                assert body["error"] == "unavailable" and "Redis" in body["message"], body
                assert "Error" not in body["message"] and body["request_id"] == reply.headers["X-Request-Id"]

                status, events = streamed.result(timeout=60)
                assert status == 200 and events[-1][1] == "error", events
                assert events[-1][2]["status"] == 503 and "Redis" in events[-1][2]["message"]

                after = http.post("/v1/query", json={"query": "Who bakes the buns?"})
                assert after.status_code == 503 and after.headers["Retry-After"], after.text
        finally:
            api.proc.stop()
        assert "unhandled error" not in api.proc.tail(400)  # what the error mapping logs for a 500
