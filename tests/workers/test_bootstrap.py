"""One bootstrap for every worker app: the shared app, then each part tied to the worker's life in
its order. Narrow fakes: signals of the test's own, a heartbeat and a metrics server that record."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery.utils.dispatch import Signal
from ragline.broker.config.settings import Settings
from ragline.workers import bootstrap as bootstrap_module
from ragline.workers.bootstrap import Lifecycle, bootstrap


class FakeConsumer:
    """worker_ready's sender: the queues it consumes."""

    def __init__(self, task_consumer: Any) -> None:
        self.task_consumer = task_consumer


class FakeHeartbeat:
    def __init__(self, queue: str, settings: Any, log: list[str]) -> None:
        self.queues: tuple[str, ...] = (queue,)
        self.log = log

    def start(self, consumed: list[str]) -> None:
        if consumed:
            self.queues = tuple(consumed)
        self.log.append(f"heartbeat start {','.join(self.queues)}")

    def stop(self) -> None:
        self.log.append("heartbeat stop")


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    happened: list[str] = []
    monkeypatch.setattr(
        bootstrap_module, "Heartbeat", lambda queue, settings, **_: FakeHeartbeat(queue, settings, happened)
    )
    monkeypatch.setattr(
        bootstrap_module.metrics_server, "serve", lambda settings, labels=None: happened.append("metrics")
    )
    return happened


def _lifecycle() -> Lifecycle:
    return Lifecycle(
        init=Signal(name="test_init"),
        ready=Signal(name="test_ready"),
        stopping=Signal(name="test_stopping"),
        shutdown=Signal(name="test_shutdown"),
    )


def _step(log: list[str], name: str) -> Any:
    def step() -> None:
        log.append(name)

    step.__name__ = name
    return step


def test_each_part_runs_at_its_moment_in_order(log: list[str], caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = _lifecycle()
    settings = Settings().replace(key_prefix="bootstrap-test", torch_threads=3)
    worker = bootstrap(
        "retrieval",
        settings,
        init=[_step(log, "warm up"), _step(log, "load")],
        ready=[_step(log, "poller")],
        stopping=[_step(log, "hand back")],
        shutdown=[_step(log, "engine stop")],
        lifecycle=lifecycle,
    )
    assert worker.keys.prefix == "bootstrap-test" and worker.settings is settings
    assert log == []  # nothing runs at import

    lifecycle.init.send(sender=None)
    assert log == ["warm up", "load"]
    consumer = FakeConsumer(task_consumer=SimpleNamespace(queues=[SimpleNamespace(name="retrieval.docs")]))
    with caplog.at_level(logging.INFO, logger="ragline.workers.bootstrap"):
        lifecycle.ready.send(sender=consumer)
    assert log[2:] == ["metrics", "heartbeat start retrieval.docs", "poller"]
    assert f"retrieval.docs worker: {settings.host_defaults_line()}" in caplog.text
    lifecycle.stopping.send(sender="host")
    lifecycle.shutdown.send(sender=None)
    # Readiness drops before the app's own shutdown (an engine's can take seconds).
    assert log[5:] == ["hand back", "heartbeat stop", "engine stop"]


def test_a_part_that_raises_is_logged_and_the_next_still_runs(
    log: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle = _lifecycle()

    def broken() -> None:
        raise RuntimeError("no index on disk")

    bootstrap("ingest", Settings(), init=[broken, _step(log, "sweep")], lifecycle=lifecycle)
    with caplog.at_level(logging.ERROR):
        lifecycle.init.send(sender=None)
    assert log == ["sweep"]
    assert "broken" in caplog.text and "no index on disk" in caplog.text


def test_system_exit_from_a_part_ends_the_worker(log: list[str]) -> None:
    lifecycle = _lifecycle()

    def refuse() -> None:
        raise SystemExit(2)

    bootstrap("callbacks", Settings(), init=[refuse], lifecycle=lifecycle)
    with pytest.raises(SystemExit):
        lifecycle.init.send(sender=None)


def test_the_app_is_the_brokers_with_its_guarantees(log: list[str]) -> None:
    worker = bootstrap("generation", Settings(), lifecycle=_lifecycle())
    conf = worker.app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]


def test_labels_tell_one_engines_worker_from_its_siblings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def heartbeat(queue: str, settings: object, *, tag: str = "") -> FakeHeartbeat:
        seen["tag"] = tag
        return FakeHeartbeat(queue, settings, [])

    monkeypatch.setattr(bootstrap_module, "Heartbeat", heartbeat)
    monkeypatch.setattr(
        bootstrap_module.metrics_server, "serve", lambda settings, labels=None: seen.update(labels=labels)
    )
    lifecycle = _lifecycle()
    bootstrap("generation", Settings(), lifecycle=lifecycle, labels={"gpu": "2"})
    lifecycle.ready.send(sender=None)
    assert seen == {"tag": "gpu2", "labels": {"gpu": "2"}}
