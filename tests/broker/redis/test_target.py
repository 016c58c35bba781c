"""RAGLINE_REDIS_URL, read in one place: one Redis as written, or a Sentinel set (its sentinels,
the primary's name, the database, passwords and TLS); every client, the Celery broker and the
retry policy are built from what it names."""

from __future__ import annotations

import pytest
import redis
from pydantic import ValidationError
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import RedisSettings
from ragline.broker.redis.pool import async_retry, retries_within, sync_retry
from ragline.broker.redis.target import InvalidRedisUrl, parse

pytestmark = pytest.mark.unit


def test_a_plain_url_is_used_as_written() -> None:
    target = parse("redis://:pw@10.0.0.5:6380/2")
    assert not target.is_sentinel
    assert target.kombu_url() == target.url == "redis://:pw@10.0.0.5:6380/2"
    assert "pw" not in target.describe()


def test_a_sentinel_url_names_the_sentinels_the_primary_and_the_database() -> None:
    target = parse("redis+sentinel://:s%40cret@h1:26379,h2,[::1]:26380/mymaster/4?sentinel_password=sp")
    assert target.sentinels == (("h1", 26379), ("h2", 26379), ("::1", 26380))
    assert (target.master, target.db) == ("mymaster", 4)
    assert (target.password, target.sentinel_password) == ("s@cret", "sp")
    assert target.node_kwargs() == {"db": 4, "password": "s@cret"}
    assert target.sentinel_kwargs(socket_timeout=1.0) == {"socket_timeout": 1.0, "password": "sp"}
    assert target.kombu_url() == (
        "sentinel://:s%40cret@h1:26379/4;sentinel://:s%40cret@h2:26379/4;sentinel://:s%40cret@[::1]:26380/4"
    )
    assert "cret" not in target.describe() and "sp" not in target.describe()


def test_the_database_defaults_to_0_and_the_setting_gives_the_sentinel_password() -> None:
    target = parse("redis+sentinel://h1:26379/m", sentinel_password="from-setting")
    assert (target.db, target.password, target.sentinel_password) == (0, None, "from-setting")
    assert parse("redis+sentinel://h1/m?sentinel_password=q", sentinel_password="s").sentinel_password == "q"


def test_tls_options_go_to_the_data_nodes_and_the_sentinels() -> None:
    target = parse("rediss+sentinel://h1:26379/m/1?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert target.tls
    assert target.node_kwargs() == {"db": 1, "ssl": True, "ssl_cert_reqs": "none", "ssl_ca_certs": "/ca.pem"}
    assert target.sentinel_kwargs()["ssl"] is True


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:6379", "scheme"),
        ("http://h/0", "unknown scheme"),
        ("redis+sentinel://h1:26379", "/MASTER"),
        ("redis+sentinel://h1:26379/m/x", "number"),
        ("redis+sentinel://h1:port/m", "not a number"),
        ("redis+sentinel://h1:26379,/m", "host:port"),
        ("redis+sentinel://h1/m?password=x", "options"),
        ("redis+sentinel://h1/m?ssl_cert_reqs=none", "rediss"),
    ],
)
def test_a_url_that_cannot_be_used_is_refused_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(InvalidRedisUrl, match=says):
        parse(url)
    with pytest.raises(ValidationError, match=says):
        RedisSettings(redis_url=url)


def test_replicated_writes_are_on_by_default_only_with_sentinel() -> None:
    assert RedisSettings(redis_url="redis://h/0").wait_replicas == 0
    assert RedisSettings(redis_url="redis+sentinel://h/m/0").wait_replicas == 1
    assert RedisSettings(redis_url="redis+sentinel://h/m/0", redis_wait_replicas=0).wait_replicas == 0
    assert RedisSettings(redis_url="redis://h/0", redis_wait_replicas=2).wait_replicas == 2


def test_a_wait_longer_than_the_socket_timeout_is_refused() -> None:
    with pytest.raises(ValidationError, match="below RAGLINE_REDIS_SOCKET_TIMEOUT_S"):
        RedisSettings(redis_url="redis+sentinel://h/m/0", redis_wait_ms=5000, redis_socket_timeout_s=5)
    assert RedisSettings(redis_wait_ms=5000, redis_socket_timeout_s=5).wait_replicas == 0  # no WAIT: no bound
    with pytest.raises(ValidationError, match="negative"):
        RedisSettings(redis_wait_ms=-1)
    assert RedisSettings(redis_wait_ms=4999, redis_socket_timeout_s=5).redis_wait_ms == 4999


def test_celery_reaches_the_primary_through_kombus_sentinel_transport() -> None:
    settings = RedisSettings(
        redis_url="redis+sentinel://:pw@h1:26379,h2:26380/mymaster/3?sentinel_password=sp"
    )
    app = create_celery(settings)
    assert app.conf.broker_url == "sentinel://:pw@h1:26379/3;sentinel://:pw@h2:26380/3"
    options = app.conf.broker_transport_options
    assert options["master_name"] == "mymaster"
    assert options["sentinel_kwargs"]["password"] == "sp"
    assert options["visibility_timeout"] == settings.visibility_timeout_s
    conn = app.connection_for_write()
    assert type(conn.transport).__module__ == "ragline.broker.redis.transport"  # the reconnect fix kept
    assert create_celery(RedisSettings(redis_url="rediss+sentinel://h1/m")).conf.broker_use_ssl


def test_connection_errors_are_retried_with_backoff_within_the_calls_timeout() -> None:
    assert retries_within(0.0) == 0
    assert retries_within(0.3) == 2  # 0.1 + 0.2
    assert retries_within(5.0) == 7  # 0.1 + 0.2 + 0.4 + 0.8, then 1 (the cap) three times
    for retry in (sync_retry(5.0), async_retry(5.0)):
        assert retry.get_retries() == 7
        assert retry._supported_errors == (redis.ConnectionError,)  # a timeout is not retried
