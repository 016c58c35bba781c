"""SSE streams through a real proxy with a short idle timeout: Debian's nginx, run as this test's own
process on loopback with ``proxy_read_timeout 1s``, in front of API processes.

A stream whose request waits (nothing consumes its queue here) keeps its connection through the
proxy with heartbeats until its stall limit, then ends with an ``error`` event naming the stall;
without heartbeats the proxy cuts the same wait (the control: the timeout is real). On the
session's workers, requests queued behind long answers (every generation slot taken by jobs,
more in line) wait with nothing to send for longer than the proxy's timeout, heartbeats keeping
the connection, and complete through it, ours and the OpenAI stream alike.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes

from tests.helpers import Api, Workers, free_port, redis_db_after, start_api

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
PROXY_TIMEOUT_S = 1.0
HEARTBEAT_S = 0.3
STALL_S = 2.0
LONG_DEADLINE = {"X-Request-Deadline-Ms": "120000"}
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx (deploy/install.sh installs it)"),
]


@dataclass
class Proxy:
    bases: dict[str, str]  # upstream name -> the proxy's address for it
    log: Path


def _nginx_config(prefix: Path, upstreams: dict[str, str], ports: dict[str, int]) -> str:
    # Run as root, nginx would hand its workers to "nobody", who cannot read a test's tmp_path.
    user = "user root;\n" if os.geteuid() == 0 else ""
    servers = "".join(
        f"""
  server {{
    listen 127.0.0.1:{ports[name]};
    location / {{
      proxy_pass {upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout {PROXY_TIMEOUT_S:g}s;
    }}
  }}"""
        for name, upstream in upstreams.items()
    )
    temp = " ".join(
        f"{kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""{user}daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} info;
events {{ worker_connections 64; }}
http {{
  access_log {prefix / "access.log"};
  {temp}
{servers}
}}
"""


@pytest.fixture
def proxy_for(tmp_path: Path) -> Iterator[Any]:
    """Starts nginx in front of the given upstreams (name -> base URL): one port each."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstreams: dict[str, str]) -> Proxy:
        prefix = tmp_path / "nginx"
        prefix.mkdir()
        ports = {name: free_port() for name in upstreams}
        conf = prefix / "nginx.conf"
        conf.write_text(_nginx_config(prefix, upstreams, ports))
        cmd = [NGINX or "nginx", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
        check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, timeout=30, check=False)
        assert check.returncode == 0, check.stderr
        procs.append(subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.STDOUT))
        bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        deadline = time.monotonic() + 15
        for base in bases.values():
            while True:
                try:
                    httpx.get(base + "/healthz", timeout=2)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, (prefix / "error.log").read_text()
                    time.sleep(0.1)
        return Proxy(bases, prefix / "error.log")

    try:
        yield start
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _apis(settings: Settings, logs: Path) -> Iterator[tuple[Api, Api]]:
    """Two API processes: one with heartbeats every HEARTBEAT_S and a stall limit of STALL_S, one
    that never sends a heartbeat. Admission is off in both, so that a short deadline is not
    refused while the generation slots are full."""
    paced = start_api(
        settings.replace(sse_heartbeat_s=HEARTBEAT_S, stream_stall_s=STALL_S, admission_enabled=False),
        logs / "paced-api.log",
    )
    try:
        silent = start_api(
            settings.replace(sse_heartbeat_s=3600.0, admission_enabled=False), logs / "silent-api.log"
        )
        try:
            yield paced, silent
        finally:
            silent.proc.stop()
    finally:
        paced.proc.stop()


@pytest.fixture
def idle_apis(settings: Settings, tmp_path: Path) -> Iterator[tuple[Api, Api]]:
    """The two APIs on a Redis database of their own where an index is registered and no worker
    consumes anything: every request waits for its retrieval forever."""
    url = redis_db_after(settings.redis.redis_url, 1, "RAGLINE_TEST_PROXY_REDIS_URL")
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    own = settings.replace(redis_url=url, default_index="waiting")
    info = indexes.IndexInfo(name="waiting", version="v1", path="/nowhere", chunks=1, dim=384)
    indexes.register(client, Keys(own.redis.key_prefix), info)
    try:
        yield from _apis(own, tmp_path)
    finally:
        client.flushdb()


@pytest.fixture
def queued_apis(settings: Settings, tmp_path: Path) -> Iterator[tuple[Api, Api]]:
    """The two APIs on the session's Redis and workers."""
    yield from _apis(settings, tmp_path)


@dataclass
class Seen:
    """What one stream's client saw, each with its time since the request was sent."""

    events: list[tuple[float, str, str]] = field(default_factory=list)  # (at, event or "data", data)
    heartbeats: list[float] = field(default_factory=list)
    opened: float = 0.0  # when the response's head came
    failure: str = ""  # how the connection broke, if it did

    def first(self, name: str) -> float:
        return next(at for at, event, _ in self.events if event == name)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.events]


def _read(base: str, path: str, body: dict[str, Any], headers: dict[str, str], seen: Seen) -> None:
    t0 = time.monotonic()
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(10, read=60)) as client,
            client.stream("POST", base + path, json=body, headers=headers) as response,
        ):
            assert response.status_code == 200, response.read()
            seen.opened = time.monotonic() - t0
            event = "data"
            for line in response.iter_lines():
                at = time.monotonic() - t0
                if line.startswith(":"):
                    seen.heartbeats.append(at)
                elif line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    seen.events.append((at, event, line.removeprefix("data: ")))
                    event = "data"
    except httpx.HTTPError as exc:
        seen.failure = f"{type(exc).__name__}: {exc}"


def _read_all(*streams: tuple[str, str, dict[str, Any], dict[str, str], Seen]) -> None:
    """Read the streams at once, each on a thread of its own, until they end."""
    readers = [threading.Thread(target=_read, args=args) for args in streams]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(180)
        assert not reader.is_alive(), "a stream did not end within 180 s"


def _fill_generation(base: str, index: str, n: int, busy: int) -> None:
    """``n`` RAG jobs, sent one after another; returns once ``busy`` of them have their sources
    (every generation slot taken), the rest still ahead in line of whatever is sent next."""
    ids = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(n):
            body = {
                "query": f"Tell me everything about Café Lumière, its hours, its bun and its terrace ({i}).",
                "index": index,
                "allow_degraded": False,
                "temperature": 1.0,
            }
            response = client.post("/v1/jobs", json=body, headers=LONG_DEADLINE)
            assert response.status_code == 202, response.text
            ids.append(response.json()["job_id"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            statuses = [client.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in ids]
            if sum(s not in ("queued", "retrieving") for s in statuses) >= busy:
                return
            time.sleep(0.1)
    pytest.fail(f"the jobs did not get their sources in time: {statuses}")


@pytest.mark.stack
def test_a_waiting_stream_outlives_the_proxy_timeout_until_it_stalls(
    idle_apis: tuple[Api, Api], proxy_for: Any
) -> None:
    paced, silent = idle_apis
    proxy = proxy_for({"paced": paced.base, "silent": silent.base})
    body = {"query": "When does Café Lumière open?", "allow_degraded": False}
    # A deadline below the stall limit: the stall limit is the stream's bound.
    short = {"X-Request-Deadline-Ms": "1000"}
    chat = {"model": "waiting", "messages": [{"role": "user", "content": body["query"]}], "stream": True}
    stalled, openai, control = Seen(), Seen(), Seen()
    _read_all(
        (proxy.bases["paced"], "/v1/query/stream", body, short, stalled),
        (proxy.bases["paced"], "/v1/chat/completions", chat, short, openai),
        (proxy.bases["silent"], "/v1/query/stream", body, short, control),
    )

    # The control: the same wait without heartbeats is cut by the proxy at its idle timeout.
    assert control.events == [] and control.failure, (control.events, control.failure)
    assert "upstream timed out" in proxy.log.read_text()

    # Heartbeats kept ours through the proxy until the stall limit; then it said why it ended.
    assert not stalled.failure, stalled.failure
    assert stalled.names() == ["error"], stalled.events
    at, _, data = stalled.events[0]
    error = json.loads(data)
    assert error["status"] == 504 and f"stalled: nothing new for {STALL_S:g} s" in error["message"]
    assert STALL_S <= at < STALL_S + 1.5
    assert len(stalled.heartbeats) >= int(STALL_S / HEARTBEAT_S) - 1, stalled.heartbeats

    # The OpenAI stream alike, in OpenAI's shape, then [DONE].
    assert not openai.failure, openai.failure
    data = [d for _, _, d in openai.events]
    assert len(data) == 2 and data[1] == "[DONE]", data
    assert json.loads(data[0])["error"]["code"] == "stalled"
    assert openai.heartbeats


def test_streams_queued_behind_long_answers_complete_through_a_proxy_with_a_short_idle_timeout(
    workers: Workers, settings: Settings, test_index: str, queued_apis: tuple[Api, Api], proxy_for: Any
) -> None:
    paced, _ = queued_apis
    proxy = proxy_for({"paced": paced.base})
    # Every slot taken and twice as many jobs in line: whatever comes next waits for rounds of
    # answers, however fast the engine or short the answers.
    slots = settings.generation.max_num_seqs
    _fill_generation(paced.base, test_index, slots * 3, busy=slots)

    def question() -> str:
        return f"When does Café Lumière open, and what is its speciality? ({uuid.uuid4().hex[:8]})"

    body = {"query": question(), "index": test_index, "allow_degraded": False}
    chat = {"model": test_index, "messages": [{"role": "user", "content": question()}], "stream": True}
    ours, openai = Seen(), Seen()
    _read_all(
        (proxy.bases["paced"], "/v1/query/stream", body, LONG_DEADLINE, ours),
        (proxy.bases["paced"], "/v1/chat/completions", chat, LONG_DEADLINE, openai),
    )

    # Ours waited in line, with nothing to send (its sources come as its answer starts), for
    # longer than the proxy's timeout; heartbeats kept the connection meanwhile, and it completed.
    assert not ours.failure, ours.failure
    assert ours.names()[0] == "sources" and ours.names()[-1] == "done", ours.names()
    times = [ours.opened, *(at for at, _, _ in ours.events)]
    silence = max(itertools.pairwise(times), key=lambda gap: gap[1] - gap[0])
    assert silence[1] - silence[0] > PROXY_TIMEOUT_S, (
        f"it did not wait longer than the proxy's timeout: {silence}"
    )
    # The proxy never saw the connection idle for its timeout: a heartbeat came within each.
    kept = [silence[0], *(at for at in ours.heartbeats if silence[0] < at < silence[1]), silence[1]]
    idle = max(b - a for a, b in itertools.pairwise(kept))
    assert idle < PROXY_TIMEOUT_S, (silence, ours.heartbeats)

    # The OpenAI stream alike: its chunks, then [DONE].
    assert not openai.failure, openai.failure
    data = [d for _, _, d in openai.events]
    assert data[-1] == "[DONE]" and len(data) > 3, data
    assert '"finish_reason":' in data[-2] and '"error"' not in data[-2], data[-2]
    assert openai.heartbeats
