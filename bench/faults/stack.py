"""The stack bench/faults/run.py injects faults into: the processes ``ragline up`` runs (API,
retrieval, generation, callbacks and ingest workers) on a redis-server of its own (a free port, AOF on),
so that Redis can be SIGKILLed, restarted and given a ``maxmemory`` without touching any other.

Where this process may (root, ``unshare``), the callbacks worker runs in a mount namespace whose
``/etc/resolv.conf`` names a DNS server that never answers, and the API in one whose
``/etc/hosts`` resolves the hostile scenario's webhook names: a URL the API accepted whose
lookups then hang at delivery, the resolver fault the callbacks worker must survive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import apikeys
from ragline.workers.generation.model_prep import prepare_default_model

from bench.env import settings_env, share_models
from bench.faults.receivers import silent_dns
from bench.overload import ensure_index
from ragline import ha, processes

INDEX = "faults"
# The ingest worker reads what the fuzz scenario uploads: a job it fails with a 5xx is counted.
WORKERS = ("retrieval", "generation", "callbacks", "ingest")
# The silent DNS server's address (any of 127/8 is loopback), and the names the API resolves to a
# public address of no one's receiver, so that they pass its check and hang at delivery.
SILENT_DNS = "127.53.0.1"
HUNG_HOST = "hung-{}.faults.invalid"
HUNG_HOST_ADDRESS = "93.184.215.14"
HUNG_HOSTS = 32
# Trickling receivers listen here, normal ones on 127.0.0.1: the per-host cap counts hosts.
TRICKLE_HOST = "127.0.0.2"


def namespaces_available() -> bool:
    """Root with ``unshare``: a child can get an /etc/resolv.conf or /etc/hosts of its own."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def _bound(path: Path, target: str, cmd: list[str]) -> list[str]:
    """``cmd`` in a mount namespace of its own where ``path`` is seen at ``target``."""
    return ["unshare", "-m", "sh", "-c", f'mount --bind "$0" {target} && exec "$@"', str(path), *cmd]


def bench_settings(home: Path, redis_url: str, **overrides: object) -> Settings:
    share_models(home)
    base: dict[str, object] = {
        "home": home,
        "redis_url": redis_url,
        "default_index": INDEX,
        "enforce_eager": True,
        "max_num_seqs": 8,
        # Every answer this long: a stream is still generating when its worker is killed.
        "max_new_tokens": 48,
        "min_new_tokens": 48,
        "worker_heartbeat_s": 0.5,
        "worker_heartbeat_ttl_s": 2.0,
        # A killed worker's task comes back this soon (longer than any task here takes).
        "visibility_timeout_s": 20,
        "request_timeout_s": 240.0,
        # The hostile upload's document, were its reader quadratic again, is cut here and fails
        # alone (ingest_quadratic_p99_ratio); every other upload here reads in milliseconds.
        "ingest_document_timeout_s": 10.0,
        "auth_enabled": True,
        "webhook_host_allowlist": ["127.0.0.1", TRICKLE_HOST],
        "webhook_backoff_base_s": 0.5,
        "webhook_backoff_max_s": 2.0,
        "webhook_poll_interval_s": 0.1,
        "webhook_secret": "faults-bench-webhook-secret",
        "flower_password": "faults-bench-flower-password",
    }
    return Settings().replace(**(base | overrides))


@dataclass
class FaultStack:
    settings: Settings
    logs: Path
    redis_port: int
    redis_dir: Path
    hung_resolver: bool
    # A Sentinel set (ragline.ha's, as `ragline up --ha` runs it) instead of the one redis-server.
    ha_ports: ha.HaPorts | None = None
    supervisor: processes.Supervisor = field(default_factory=processes.Supervisor)
    _files: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ragline-faults-ns-")))
    log_offsets: dict[str, int] = field(default_factory=dict)  # name -> its log's size at its start

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.settings.api.api_port}"

    @property
    def redis(self) -> redis.Redis:
        if self.ha_ports is not None:  # the primary, wherever the sentinels say it is
            return sync_client(self.settings.redis)
        return redis.Redis(port=self.redis_port, socket_timeout=5, socket_connect_timeout=2)

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.redis.key_prefix)

    # -- processes -----------------------------------------------------------------------------

    def _start(self, name: str, cmd: list[str], env: dict[str, str], *, last: bool = False) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.log_offsets[name] = log.tell()
        self.supervisor.start(name, cmd, env, stdout=log, last=last)

    def _env(self, kind: str) -> dict[str, str]:
        return processes.child_env(self.settings, kind=kind) | settings_env(self.settings)

    def start_redis(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is needed (Debian: apt-get install -y redis-server)"
        # As deployed (deploy/k8s/redis.yaml): AOF, fsync once a second, no RDB; noeviction.
        args = ["--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(self.redis_dir)]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        args += ["--maxmemory-policy", "noeviction"]
        self._start("redis", [exe, *args], dict(os.environ), last=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.redis.ping()
                return
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.ConnectionError:
                self.check()
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def start_ha(self) -> None:
        """The Sentinel set, its data nodes with AOF; until its primary has both replicas in sync."""
        assert self.ha_ports is not None
        for name, cmd in ha.commands(self.ha_ports, self.redis_dir):
            self._start(name, cmd, dict(os.environ), last=True)
        self.wait_ha()

    def wait_ha(self, timeout_s: float = 60) -> None:
        assert self.ha_ports is not None
        deadline = time.monotonic() + timeout_s
        while not ha.ready(self.ha_ports):
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinel set was not whole within {timeout_s:.0f} s")
            time.sleep(0.1)

    def primary_port(self) -> int:
        """The data node the sentinels name as the primary."""
        assert self.ha_ports is not None
        for port in self.ha_ports.sentinels:
            with contextlib.suppress(redis.RedisError):
                address = redis.Redis(port=port, socket_timeout=2).sentinel_get_master_addr_by_name(
                    ha.MASTER_NAME
                )
                if isinstance(address, tuple):
                    return int(address[1])
        raise RuntimeError("no sentinel answers")

    def start_node(self, port: int) -> None:
        """A data node of the set started again, as a replica of today's primary."""
        assert self.ha_ports is not None
        name = f"redis-{port}"
        command = dict(ha.commands(self.ha_ports, self.redis_dir))[name]
        if "--replicaof" in command:
            at = command.index("--replicaof")
            del command[at : at + 3]
        command += ["--replicaof", ha.HOST, str(self.primary_port())]
        self._start(name, command, dict(os.environ), last=True)

    def start_worker(self, kind: str) -> None:
        cmd = processes.worker_command(kind, self.settings)
        if kind == "callbacks" and self.hung_resolver:
            resolv = self._files / "resolv.conf"
            resolv.write_text(f"nameserver {SILENT_DNS}\noptions timeout:30 attempts:5\n")
            cmd = _bound(resolv, "/etc/resolv.conf", cmd)
        self._start(kind, cmd, self._env(kind))

    def start_api(self) -> None:
        cmd = processes.api_command(self.settings.api)
        if self.hung_resolver:
            hosts = self._files / "hosts"
            extra = "".join(f"{HUNG_HOST_ADDRESS} {HUNG_HOST.format(i)}\n" for i in range(HUNG_HOSTS))
            hosts.write_text(Path("/etc/hosts").read_text() + "\n" + extra)
            cmd = _bound(hosts, "/etc/hosts", cmd)
        self._start("api", cmd, self._env("api"))

    def child(self, name: str) -> processes.Child:
        return next(c for c in self.supervisor.children if c.name == name)

    def pid(self, name: str) -> int:
        return self.child(name).proc.pid

    def kill(self, name: str) -> None:
        """SIGKILL the whole process group (a generation worker's engine core with it)."""
        child = self.child(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait(30)
        self.supervisor.children.remove(child)

    def pause(self, name: str, paused: bool) -> None:
        os.killpg(self.pid(name), signal.SIGSTOP if paused else signal.SIGCONT)

    def rss(self, name: str) -> int:
        """Bytes resident in the child and every process it started."""
        try:
            root = psutil.Process(self.pid(name))
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total

    def names(self) -> list[str]:
        return [c.name for c in self.supervisor.children]

    def check(self) -> None:
        child = self.supervisor.exited()
        if child is not None:
            tail = (self.logs / f"{child.name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{tail}")

    def revive(self) -> list[str]:
        """Start again whatever exited (a worker that did not survive a fault); returns their names."""
        dead = [c for c in self.supervisor.children if c.proc.poll() is not None]
        for child in dead:
            self.supervisor.children.remove(child)
            if child.name == "redis":
                self.start_redis()
            elif child.name.startswith("redis-"):  # a node of the Sentinel set
                self.start_node(int(child.name.removeprefix("redis-")))
            elif child.name == "api":
                self.start_api()
            else:
                self.start_worker(child.name)
        if dead:
            self.wait_ready()
        return [c.name for c in dead]

    def _was_ready(self, name: str) -> bool:
        """Its Celery consumer came up since its last start (it logs "<name>@<host> ready.")."""
        with (self.logs / f"{name}.log").open("rb") as log:
            log.seek(self.log_offsets.get(name, 0))
            return b" ready." in log.read()

    def stale_workers(self) -> list[str]:
        """Workers whose process runs and was ready once, but that have no fresh heartbeat now:
        they stopped consuming (one still loading its engine is not stale)."""
        since = time.time() - self.settings.redis.worker_heartbeat_ttl_s
        running = {c.name for c in self.supervisor.children if c.proc.poll() is None}
        try:
            return [
                k
                for k in WORKERS
                if k in running
                and self._was_ready(k)
                and not self.redis.zcount(self.keys.workers(k), since, "+inf")
            ]
        except redis.RedisError:
            return []

    def heal(self, grace_s: float = 45) -> list[str]:
        """After a fault: start again what exited, and what still runs but stays stale for
        ``grace_s`` (a worker that never reconnected); returns what was restarted."""
        restarted = self.revive()
        deadline = time.monotonic() + grace_s
        while (stale := self.stale_workers()) and time.monotonic() < deadline:
            time.sleep(1.0)
        for kind in stale:
            self.kill(kind)
            self.start_worker(kind)
            restarted.append(f"{kind} (running, but no heartbeat for {grace_s:.0f} s)")
        self.wait_ready()  # a worker a scenario started again may still be loading
        return restarted

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            try:
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"ragline was not ready within {timeout_s:.0f} s (logs: {self.logs})")

    # -- keys ----------------------------------------------------------------------------------

    def key(
        self,
        name: str,
        *,
        rate: float | None = 1e6,
        burst: int | None = 1_000_000,
        scopes: tuple[str, ...] = (apikeys.READ,),
    ) -> dict[str, str]:
        """A new API key's headers (default scope: read, which asks and runs jobs)."""
        key, _ = apikeys.create(self.redis, self.keys, name, rate=rate, burst=burst, scopes=scopes)
        return {"Authorization": f"Bearer {key}"}


@contextlib.contextmanager
def running(
    home: Path, *, hung_resolver: bool | None = None, sentinel: bool = False, **overrides: object
) -> Iterator[FaultStack]:
    """Redis (a Sentinel set with ``sentinel``), the workers and the API, ready; the index
    ingested once into ``home``."""
    processes.interrupt_on_signals()
    hung = namespaces_available() if hung_resolver is None else hung_resolver
    port = processes.free_port()
    ha_ports = None
    url = f"redis://127.0.0.1:{port}/0"
    if sentinel:
        free = [processes.free_port() for _ in range(6)]
        ha_ports = ha.HaPorts(data=(free[0], free[1], free[2]), sentinels=(free[3], free[4], free[5]))
        url = ha_ports.url()
    settings = bench_settings(home, url, api_port=processes.free_port(), **overrides)
    logs = Path(tempfile.mkdtemp(prefix="ragline-faults-"))
    stack = FaultStack(settings, logs, port, logs / "redis", hung, ha_ports)
    stack.redis_dir.mkdir()
    with contextlib.ExitStack() as outside:
        if hung:
            outside.enter_context(silent_dns(SILENT_DNS))
        try:
            stack.start_ha() if sentinel else stack.start_redis()
            prepare_default_model(settings)  # once, into the shared models folder
            ensure_index(settings, INDEX)
            for kind in WORKERS:
                stack.start_worker(kind)
            stack.start_api()
            stack.wait_ready()
            yield stack
        finally:
            for name in stack.names():
                if not name.startswith(("redis", "sentinel-")):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(stack.pid(name), signal.SIGCONT)  # a paused one can stop
            stack.supervisor.stop()
