"""A local Redis Sentinel set: one primary, two replicas and three sentinels on loopback ports.

``ragline up --ha`` runs one under its supervisor, and the tests start the same set
(``tests/sentinel_set.py``). Debian's ``redis-server`` and ``redis-sentinel`` (or
``redis-server --sentinel``) run it; the data nodes keep an append-only file, so a node that
restarts comes back with what it had. The sentinels agree (quorum 2 of 3) that the primary is
down after :data:`DOWN_AFTER_MS` without an answer, then promote a replica; every ragline client
finds the new primary through them (``redis+sentinel://`` in ``RAGLINE_REDIS_URL``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASTER_NAME = "ragline"
QUORUM = 2
# How long the sentinels wait for a silent primary before they call it down. Shorter fails over
# sooner and risks a failover on a pause (a long fork for an AOF rewrite, say).
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 10_000
HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class HaPorts:
    data: tuple[int, int, int]  # the first starts as the primary
    sentinels: tuple[int, int, int]

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"{HOST}:{p}" for p in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/{db}"

    @classmethod
    def parse(cls, text: str) -> HaPorts:
        """Six ports, comma-separated: the three data nodes', then the three sentinels'."""
        try:
            ports = [int(p) for p in text.split(",")]
        except ValueError:
            raise ValueError(f"--ha-ports takes six numbers, comma-separated, not {text!r}") from None
        if len(ports) != 6 or len(set(ports)) != 6 or not all(0 < p < 65536 for p in ports):
            raise ValueError(
                f"--ha-ports takes six distinct ports (three data nodes, three sentinels), not {text!r}"
            )
        return cls(data=(ports[0], ports[1], ports[2]), sentinels=(ports[3], ports[4], ports[5]))


# Beside a Redis on the usual 6379 and a sentinel on 26379, not on them.
DEFAULT_PORTS = HaPorts(data=(6380, 6381, 6382), sentinels=(26380, 26381, 26382))


def executables() -> tuple[str, list[str]]:
    """redis-server, and the command that runs a sentinel (before its config file's path)."""
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError(
            "redis-server is needed for --ha (Debian: apt-get install redis-server redis-sentinel)"
        )
    sentinel = shutil.which("redis-sentinel")
    # redis-sentinel is redis-server under another name; without the link, --sentinel does the same.
    return server, [sentinel] if sentinel else []


def node_command(
    server: str, folder: Path, port: int, *, primary_port: int | None, aof: bool = True
) -> list[str]:
    """One data node (a replica of ``primary_port`` when given), its files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        server,
        "--port", str(port),
        "--bind", HOST,
        "--dir", str(folder),
        "--save", "",
        "--appendonly", "yes" if aof else "no",
        "--maxmemory-policy", "noeviction",
        # A replica that connects gets the data at once: Redis's default waits 5 s for others to share
        # the transfer, and a new primary's replicas must be in sync before WAIT can succeed.
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip
    if primary_port is not None:
        command += ["--replicaof", HOST, str(primary_port)]
    return command


def sentinel_config(port: int, primary_port: int, folder: Path) -> str:
    """A sentinel's config file (a sentinel rewrites its own as the set changes)."""
    return "\n".join(
        [
            f"port {port}",
            f"bind {HOST}",
            f'dir "{folder}"',
            f"sentinel monitor {MASTER_NAME} {HOST} {primary_port} {QUORUM}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
            "",
        ]
    )


def sentinel_command(server: str, sentinel: list[str], config: Path) -> list[str]:
    return [*sentinel, str(config)] if sentinel else [server, str(config), "--sentinel"]


def commands(ports: HaPorts, folder: Path, *, aof: bool = True) -> list[tuple[str, list[str]]]:
    """(name, command) for each process of the set: the data nodes first, then the sentinels."""
    server, sentinel = executables()
    primary = ports.data[0]
    out: list[tuple[str, list[str]]] = []
    for i, port in enumerate(ports.data):
        out.append(
            (
                f"redis-{port}",
                node_command(
                    server, folder / f"redis-{port}", port, primary_port=None if i == 0 else primary, aof=aof
                ),
            )
        )
    for port in ports.sentinels:
        where = folder / f"sentinel-{port}"
        where.mkdir(parents=True, exist_ok=True)
        config = where / "sentinel.conf"
        config.write_text(sentinel_config(port, primary, where))
        out.append((f"sentinel-{port}", sentinel_command(server, sentinel, config)))
    return out


def ready(ports: HaPorts, timeout_s: float = 1.0) -> bool:
    """Whether the set can fail over: a primary with both replicas in sync, and every sentinel
    knowing both replicas and the other two sentinels (it learns replicas from the primary's INFO,
    every 10 s: one that has not yet could not promote any)."""
    import redis

    try:
        views: list[dict[str, Any]] = []
        for port in ports.sentinels:
            sentinel = redis.Redis(host=HOST, port=port, socket_timeout=timeout_s, decode_responses=True)
            view = sentinel.sentinel_master(MASTER_NAME)
            if not isinstance(view, dict):
                return False
            views.append(view)
        if not all(int(v["num-slaves"]) == 2 and int(v["num-other-sentinels"]) == 2 for v in views):
            return False
        node = redis.Redis(host=views[0]["ip"], port=int(views[0]["port"]), socket_timeout=timeout_s)
        info = node.info("replication")
        # Connected is not enough: a replica still loading the primary's data acknowledges nothing.
        online = [
            v
            for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        ]
        return bool(info["role"] == "master" and len(online) == 2)
    except (redis.RedisError, KeyError, ValueError):
        return False
