"""Helpers shared by several test files (fixtures stay in conftest.py, which uses these too):
processes (workers, an API) as subprocesses, a stack of its own on another Redis database, SSE
parsing, watching what a Redis database is sent, Redis servers of a test's own, job records."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.requests import JobRequest
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import apikeys, indexes, jobs

# -- the test corpus (the session's index "test" is ingested from it) --------------------------

CAFE_DOC = """# Café Lumière

Café Lumière is a small made-up coffee house on Harbour Street in the town of Vellmar.
Café Lumière opens at 7:15 in the morning every day and closes at 16:30.
Its house speciality is a cardamom bun, and dogs are welcome on the terrace.
"""

FILLER_DOCS = {
    "bicycle.md": "# Bicycle maintenance\n\nOil the chain every 300 kilometres. Check tyre pressure weekly; "
    "a road tyre wants about 6 bar. Replace brake pads when the groove is gone.",
    "tea.md": "# Brewing green tea\n\nUse water at about 80 degrees Celsius and steep for two minutes. "
    "Boiling water makes green tea bitter.",
    "library.rst": "Town library\n============\n\nThe Vellmar town library lends books for three weeks. "
    "It is closed on Mondays and opens at 10:00 on other days.",
    "trains.txt": "The regional train to the coast leaves from platform 2 every hour at twenty past. "
    "Tickets are cheaper after 9:00 on weekdays.",
}


# -- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(settings: Settings) -> dict[str, str]:
    """The environment a ragline subprocess reads ``settings`` from."""
    env = dict(os.environ) | settings.environment()
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ragline_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ragline", *args]


@dataclass
class Proc:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def worker(kind: str, settings: Settings, log: Path) -> Proc:
    """A ``ragline worker KIND`` process (not started)."""
    return Proc(f"{kind}-worker", ragline_command("worker", kind), env_for(settings), log)


def wait_for_workers(settings: Settings, queues: tuple[str, ...], procs: list[Proc], timeout: float) -> None:
    client = sync_client(settings.redis)  # a Sentinel URL too
    keys = Keys(settings.redis.key_prefix)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                pytest.fail(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
        since = time.time() - settings.redis.worker_heartbeat_ttl_s
        if all(client.zcount(keys.workers(q), since, "+inf") for q in queues):
            return
        time.sleep(0.2)
    pytest.fail("workers did not become live in time:\n" + "\n\n".join(p.tail() for p in procs))


@dataclass
class Workers:
    retrieval: Proc
    generation: Proc
    settings: Settings
    metrics_ports: dict[str, int]


# Depth limits for the keyed APIs: far above what their tests reach by themselves, so a test can
# push a queue over them by planting this many entries in kombu's unacked hash.
AUTH_API_DEPTH_LIMIT = 20


@dataclass
class Api:
    base: str
    proc: Proc


def api_key(settings: Settings, *, rate: float | None = 1000, burst: int | None = 1000) -> tuple[str, str]:
    """A new API key on the settings' Redis: (the key, its id)."""
    key, record = apikeys.create(
        redis.Redis.from_url(settings.redis.redis_url),
        Keys(settings.redis.key_prefix),
        "test",
        rate=rate,
        burst=burst,
    )
    return key, record.id


@contextlib.contextmanager
def planted_load(settings: Settings, queue: str, n: int = AUTH_API_DEPTH_LIMIT) -> Iterator[None]:
    """Make ``queue`` look ``n`` tasks deep to the monitor: entries in kombu's unacked hash, in its
    own format, that no worker owns (nothing restores them: they are not in unacked_index)."""
    client = redis.Redis.from_url(settings.redis.redis_url)
    tags = [f"planted-{uuid.uuid4().hex}" for _ in range(n)]
    client.hset("unacked", mapping={t: json.dumps([{}, queue, queue]) for t in tags})
    try:
        time.sleep(0.3)  # a few monitor refreshes
        yield
    finally:
        client.hdel("unacked", *tags)
        time.sleep(0.3)


def wait_healthy(base: str, proc: Proc, timeout: float = 60) -> None:
    """Until ``base``/healthz answers; the test fails with the process's log otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.stop()
    pytest.fail("API did not start:\n" + proc.tail())


def start_api(settings: Settings, log: Path) -> Api:
    """An API process on a free port, once /healthz answers."""
    port = free_port()
    proc = Proc("api", ragline_command("api"), env_for(settings.replace(api_port=port)), log)
    proc.start()
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc)
    return Api(base, proc)


# -- a stack of its own on another Redis database ---------------------------------------------


def redis_db_after(base: str, offset: int, override_env: str) -> str:
    """The database ``offset`` after ``base``'s, unless the environment variable names one."""
    explicit = os.environ.get(override_env)
    if explicit:
        return explicit
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + offset}"))


@dataclass
class Stack:
    """Workers and an API of their own on their own (flushed) Redis database."""

    settings: Settings
    redis: redis.Redis
    base: str
    api: Proc
    workers: dict[str, Proc]


@contextlib.contextmanager
def stack_on_db(
    settings: Settings, url: str, kinds: tuple[str, ...], logs: Path, **overrides: object
) -> Iterator[Stack]:
    """Start ``kinds`` of workers and an API on ``url`` with ``settings`` and ``overrides``; stop
    them all and flush the database afterwards (a generation worker is given longer to stop)."""
    assert url != settings.redis.redis_url, "a stack of its own needs a database of its own"
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    s = settings.replace(redis_url=url, api_port=free_port(), **overrides)
    workers = {kind: worker(kind, s, logs / f"{kind}.log") for kind in kinds}
    api = Proc("api", ragline_command("api"), env_for(s), logs / "api.log")
    for p in workers.values():
        p.start()
    try:
        wait_for_workers(s, kinds, list(workers.values()), timeout=600)
        api.start()
        base = f"http://127.0.0.1:{s.api.api_port}"
        wait_healthy(base, api)
        yield Stack(s, client, base, api, workers)
    finally:
        api.stop()
        for kind, p in workers.items():
            p.stop(timeout=60 if kind == "generation" else 30)
        client.flushdb()


# -- an API in this process -------------------------------------------------------------------


@contextlib.contextmanager
def own_prefix(settings: Settings, index: str) -> Iterator[Settings]:
    """``settings`` under a key prefix of their own on the test Redis, where ``index`` is
    registered (at version ``v1``, no files: nothing is searched); its keys are deleted after."""
    s = settings.replace(key_prefix=f"t-{uuid.uuid4().hex[:8]}", default_index=index)
    client = redis.Redis.from_url(s.redis.redis_url)
    indexes.register(
        client,
        Keys(s.redis.key_prefix),
        indexes.IndexInfo(name=index, version="v1", path="/nowhere", chunks=1, dim=384),
    )
    try:
        yield s
    finally:
        for key in client.scan_iter(f"{s.redis.key_prefix}:*"):
            client.delete(key)


# -- what the API sends, and what Redis receives ------------------------------------------------


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str | None, str, dict]]:
    """(id, event, data) of each server-sent event."""
    event_id, event, data = None, None, []
    for line in lines:
        if not line:
            if event is not None:
                yield event_id, event, json.loads("\n".join(data))
            event_id, event, data = None, None, []
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])


@contextlib.contextmanager
def commands_seen(redis_url: str) -> Iterator[list[str]]:
    """Record every command this test database receives, with Redis MONITOR."""
    seen: list[str] = []
    client = redis.Redis.from_url(redis_url)
    ready = threading.Event()

    db = client.connection_pool.connection_kwargs.get("db", 0)

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            for cmd in monitor.listen():
                command = cmd["command"]
                if "ragline-monitor-stop" in command:  # the sentinel: everything before it was seen
                    return
                if cmd.get("db") == db:  # MONITOR sees every database of the server
                    seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield seen
    finally:
        client.get("ragline-monitor-stop")
        thread.join(5)


@contextlib.contextmanager
def pushed_queues(redis_url: str) -> Iterator[list[str]]:
    """Record every queue that gets a message pushed."""
    pushed: list[str] = []
    with commands_seen(redis_url) as seen:
        yield pushed
    pushed += [c.split()[1] for c in seen if c.upper().startswith(("LPUSH", "RPUSH"))]


# -- Redis servers of a test's own, and what they hold ----------------------------------------


@contextlib.contextmanager
def api_without_redis(settings: Settings, log: Path) -> Iterator[Api]:
    """A keyed API process whose Redis is gone (nothing listens at its port): every request
    past the probes is refused with 503 and Retry-After, since no key can be checked."""
    port = free_port()
    cut_off = settings.replace(redis_url=f"redis://127.0.0.1:{port}/0", auth_enabled=True)
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
        request=JobRequest(
            query="q", top_k=1, mode="retrieval", index="i", webhook_url=webhook_url, metadata={"a": 1}
        ),
        now=time.time(),
    )
    return {
        **record.encode(),
        "status": "done",
        "done_at": repr(time.time()),
        "result": json.dumps({"answer": None}),
    }


@contextlib.contextmanager
def redis_server(
    tmp_path: Path, *, maxmemory: str = "0", exe: str | None = None, port: int | None = None
) -> Iterator[redis.Redis]:
    """A redis-server of the test's own on a free port (the shared one's config is not ours to
    change), ``maxmemory`` with noeviction as ragline deploys it; ``exe``: another build's;
    ``port``: a given one (a server started again where the last one was)."""
    port = port or free_port()
    exe = exe or shutil.which("redis-server")
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


def batch_retriever(settings: Settings, embedder: Any, *, semantic: Any = None, **overrides: object) -> Any:
    """A retrieval worker's BatchRetriever on ``settings`` (with ``overrides``), in this process;
    ``semantic``: its semantic cache (none by default)."""
    from ragline.workers.retrieval.batch import BatchRetriever
    from ragline.workers.retrieval.embedding_cache import EmbeddingCache
    from ragline.workers.retrieval.index_store import IndexCache

    s = settings.replace(**overrides)
    client = redis.Redis.from_url(s.redis.redis_url)
    keys = Keys(s.redis.key_prefix)
    cache = EmbeddingCache(client, keys, model_id=embedder.model_id, dim=embedder.dim, ttl_s=60)
    return BatchRetriever(
        s.retrieval,
        embedder,
        cache,
        IndexCache(client, keys, ef_search=s.retrieval.hnsw_ef_search),
        semantic=semantic,
    )


def result_cache_key(settings: Settings, body: dict[str, Any], *, version: str = "v1") -> str:
    """The result cache's key for a query ``body``, as the pipeline makes it (an app in this
    process, on the same settings: the API's own normalisation and digest)."""
    from fastapi.testclient import TestClient
    from ragline.api.app import create_app
    from ragline.api.query.protocol import QueryRequest

    with TestClient(create_app(settings)) as local:
        pipeline = local.app.state.pipeline  # type: ignore[attr-defined]
        ctx = pipeline.validate(json.dumps(body).encode(), request_id="key", model=QueryRequest)
        digest = pipeline.digest(ctx.asked)
    return f"{Keys(settings.redis.key_prefix).result_cache}:{ctx.asked.index}:{version}:{digest}"
