"""`ragline up --ha`: a local Sentinel set (one primary, two replicas, three sentinels, AOF on)
that the stack's supervisor starts before everything and stops after."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis
from ragline.broker.config.settings import RedisSettings, Settings
from ragline.broker.redis.pool import sync_client

from ragline import ha, processes
from ragline.stack import _ha_redis_url
from tests.sentinel_set import ports


@pytest.mark.unit
def test_the_ports_flag_takes_six_distinct_ports() -> None:
    assert ha.HaPorts.parse("1,2,3,4,5,6") == ha.HaPorts((1, 2, 3), (4, 5, 6))
    for bad in ("1,2,3", "1,2,3,4,5,5", "a,b,c,d,e,f", "1,2,3,4,5,70000"):
        with pytest.raises(ValueError, match="--ha-ports"):
            ha.HaPorts.parse(bad)
    url = ha.DEFAULT_PORTS.url()
    assert url == "redis+sentinel://127.0.0.1:26380,127.0.0.1:26381,127.0.0.1:26382/ragline/0"
    assert RedisSettings(redis_url=url).wait_replicas == 1  # its jobs wait for a replica


@pytest.mark.unit
def test_the_set_is_a_primary_two_replicas_and_three_sentinels_with_aof(tmp_path: Path) -> None:
    commands = dict(ha.commands(ha.DEFAULT_PORTS, tmp_path))
    assert list(commands) == [
        "redis-6380", "redis-6381", "redis-6382", "sentinel-26380", "sentinel-26381", "sentinel-26382",
    ]  # fmt: skip
    for name in ("redis-6380", "redis-6381", "redis-6382"):
        command = commands[name]
        assert command[command.index("--appendonly") + 1] == "yes"
        assert command[command.index("--bind") + 1] == "127.0.0.1"
        assert ("--replicaof" in command) == (name != "redis-6380")
    config = (tmp_path / "sentinel-26381" / "sentinel.conf").read_text()
    assert "sentinel monitor ragline 127.0.0.1 6380 2" in config and "bind 127.0.0.1" in config


@pytest.mark.redis
@pytest.mark.slow
def test_up_ha_starts_the_set_and_stops_every_process(tmp_path: Path) -> None:
    the_ports = ports()
    settings = Settings().replace(home=tmp_path)
    supervisor = processes.Supervisor()
    try:
        url = _ha_redis_url(settings, supervisor, None, the_ports)
        assert len(supervisor.children) == 6
        assert sync_client(RedisSettings(redis_url=url)).ping()
        primary = redis.Redis(port=the_ports.data[0], single_connection_client=True)  # WAIT counts its writes
        assert primary.config_get("appendonly") == {"appendonly": "yes"}
        primary.set("up-ha", "1")
        assert primary.wait(2, 2000) == 2
        assert all(redis.Redis(port=p).get("up-ha") == b"1" for p in the_ports.data)
    finally:
        supervisor.stop()
    for port in (*the_ports.data, *the_ports.sentinels):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert (tmp_path / "redis-ha" / f"redis-{the_ports.data[0]}" / "appendonlydir").is_dir()
