"""A real Redis Sentinel set for tests: ``ragline.ha``'s processes (what ``ragline up --ha`` runs),
started on the ports in RAGLINE_TEST_SENTINEL_PORTS (three data nodes, then three sentinels,
comma-separated) or on free ones."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from ragline import ha
from tests.helpers import free_port


def ports() -> ha.HaPorts:
    given = [int(p) for p in os.environ.get("RAGLINE_TEST_SENTINEL_PORTS", "").split(",") if p.strip()]
    if given:
        assert len(given) == 6, "RAGLINE_TEST_SENTINEL_PORTS: three data ports, then three sentinel ports"
        return ha.HaPorts(data=(given[0], given[1], given[2]), sentinels=(given[3], given[4], given[5]))
    return ha.HaPorts(
        data=(free_port(), free_port(), free_port()), sentinels=(free_port(), free_port(), free_port())
    )


class SentinelSet:
    def __init__(self, ports: ha.HaPorts, folder: Path) -> None:
        self.ports = ports
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands = dict(ha.commands(ports, folder, aof=False))

    def url(self, db: int = 0) -> str:
        return self.ports.url(db)

    def start(self, name: str) -> None:
        log = (self.folder / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(self.commands[name], stdout=log, stderr=subprocess.STDOUT)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host=ha.HOST, port=port, socket_timeout=5, socket_connect_timeout=2)

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(
            host=ha.HOST, port=self.ports.sentinels[i], socket_timeout=5, decode_responses=True
        )

    def primary_port(self) -> int:
        """The primary's port as the sentinels report it (one that answers)."""
        for i in range(3):
            try:
                _, port = self.sentinel(i).sentinel_get_master_addr_by_name(ha.MASTER_NAME)
                return int(port)
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answers")

    def primary(self) -> redis.Redis:
        return self.node(self.primary_port())

    def wait_ready(self, timeout: float = 30) -> None:
        """Every node answers, both replicas are in sync and each sentinel sees the others."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = self.primary().info("replication")
                linked = sum(
                    1
                    for k, v in info.items()
                    if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
                )
                views = [self.sentinel(i).sentinel_master(ha.MASTER_NAME) for i in range(3)]
                # Each sentinel knows both replicas (it learns them from the primary's INFO, every
                # 10 s): one that does not could not promote it.
                known = all(int(v["num-other-sentinels"]) == 2 and int(v["num-slaves"]) == 2 for v in views)
                if info["role"] == "master" and linked == 2 and known:
                    return
            except (redis.RedisError, KeyError):
                pass
            assert time.monotonic() < deadline, "the Sentinel set did not come up"
            time.sleep(0.2)

    def wait_new_primary(self, old: int, timeout: float = 30) -> int:
        """The port of the primary the sentinels promoted instead of ``old``, once it acts as one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
                if port != old and self.node(port).info("replication")["role"] == "master":
                    return port
            except (redis.RedisError, RuntimeError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"no failover from {old} within {timeout}s")

    def kill(self, port: int) -> None:
        proc = self.procs[f"redis-{port}"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def kill_primary(self) -> tuple[int, int]:
        """SIGKILL the primary; (its port, the promoted one's) once the sentinels have switched."""
        old = self.primary_port()
        self.kill(old)
        return old, self.wait_new_primary(old)

    def revive(self) -> None:
        """Start every killed node again, as a replica of today's primary, until the set is whole."""
        primary = self.primary_port()
        for port in self.ports.data:
            name = f"redis-{port}"
            if self.procs[name].poll() is not None:
                command = list(self.commands[name])
                if "--replicaof" in command:  # it followed the first primary: now today's
                    at = command.index("--replicaof")
                    del command[at : at + 3]
                command += ["--replicaof", ha.HOST, str(primary)]
                log = (self.folder / f"{name}.log").open("ab")
                self.procs[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout=60)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def sentinel_set(folder: Path) -> Iterator[SentinelSet]:
    the_set = SentinelSet(ports(), folder)
    try:
        for name in the_set.commands:
            the_set.start(name)
        the_set.wait_ready()
        yield the_set
    finally:
        the_set.stop()
