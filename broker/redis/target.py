"""What ``RAGLINE_REDIS_URL`` names: one Redis, or a Sentinel set and the primary it watches.

The one place the URL is read. Two forms:

- ``redis://[[user]:password@]host:port/db`` (``rediss://`` for TLS, ``unix://`` too): one
  server, passed to redis-py and kombu as written.
- ``redis+sentinel://[[user]:password@]host1:26379,host2:26379,host3:26379/MASTER[/DB][?options]``
  (``rediss+sentinel://`` for TLS to the sentinels and the data nodes): the sentinels to ask, the
  name of the primary they watch (``sentinel monitor MASTER ...``) and the database. The user
  and password are the data nodes' (``requirepass``/ACL). Options in the query:
  ``sentinel_password`` (the sentinels' own ``requirepass``; else ``RAGLINE_REDIS_SENTINEL_PASSWORD``),
  ``sentinel_username``, and for TLS ``ssl_cert_reqs`` (``required``, ``optional``, ``none``),
  ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``.

Every client (:mod:`ragline.broker.redis.pool`), the Celery broker and Flower
(:mod:`ragline.broker.celery_app`) are built from a :class:`RedisTarget`, so all follow the
primary through a failover the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ragline.broker.errors import RaglineError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
DEFAULT_SENTINEL_PORT = 26379
_TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_OPTIONS = ("sentinel_password", "sentinel_username", *_TLS_OPTIONS)
_CERT_REQS = ("required", "optional", "none")


class InvalidRedisUrl(RaglineError, ValueError):
    """RAGLINE_REDIS_URL cannot be used; the message says what is wrong (never the password)."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """One Redis (``sentinels`` empty: ``url`` as given) or a Sentinel set's primary."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False
    tls_options: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)

    def node_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments for a data node (primary or replica), besides its address."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username:
            kwargs["username"] = self.username
        if self.password:
            kwargs["password"] = self.password
        if self.tls:
            kwargs["ssl"] = True
            kwargs.update(self.tls_options)
        return kwargs

    def sentinel_kwargs(self, **timeouts: float) -> dict[str, Any]:
        """redis-py keyword arguments for the connections to the sentinels themselves."""
        kwargs: dict[str, Any] = dict(timeouts)
        if self.sentinel_username:
            kwargs["username"] = self.sentinel_username
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        if self.tls:
            kwargs["ssl"] = True
            kwargs.update(self.tls_options)
        return kwargs

    def kombu_url(self) -> str:
        """The broker URL kombu reads: the URL itself, or one ``sentinel://`` per sentinel joined
        by ``;`` (kombu's failover list), each with the data nodes' credentials and database
        (kombu passes them to the primary it finds; ``master_name`` goes in the transport options)."""
        if not self.is_sentinel:
            return self.url
        auth = ""
        if self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        return ";".join(f"sentinel://{auth}{_host(h)}:{p}/{self.db}" for h, p in self.sentinels)

    def describe(self) -> str:
        """For logs: where Redis is, without any password."""
        if not self.is_sentinel:
            parts = urlsplit(self.url)
            netloc = parts.hostname or ""
            return f"{parts.scheme}://{_host(netloc)}{f':{parts.port}' if parts.port else ''}{parts.path}"
        hosts = ",".join(f"{_host(h)}:{p}" for h, p in self.sentinels)
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return f"{scheme}://{hosts}/{self.master}/{self.db}"


def _host(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def _sentinel_hosts(netloc: str) -> tuple[tuple[str, int], ...]:
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            raise InvalidRedisUrl("a Sentinel URL lists its sentinels as host:port, separated by commas")
        if part.startswith("["):  # [::1]:26379
            name, _, rest = part[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            name, _, port_text = part.partition(":")
        if not name:
            raise InvalidRedisUrl(f"sentinel {part!r} has no host")
        try:
            port = int(port_text) if port_text else DEFAULT_SENTINEL_PORT
        except ValueError:
            raise InvalidRedisUrl(f"sentinel {part!r}: the port is not a number") from None
        if not 0 < port < 65536:
            raise InvalidRedisUrl(f"sentinel {part!r}: the port is out of range")
        hosts.append((name, port))
    return tuple(hosts)


def parse(url: str, *, sentinel_password: str = "") -> RedisTarget:
    """What ``url`` names; ``sentinel_password`` is the setting's, used when the URL names none.
    :class:`InvalidRedisUrl` says what is wrong with it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidRedisUrl(
            "RAGLINE_REDIS_URL needs a scheme: redis://, rediss://, unix:// or redis+sentinel://"
        )
    if scheme.lower() not in SENTINEL_SCHEMES:
        if scheme.lower() not in ("redis", "rediss", "unix"):
            raise InvalidRedisUrl(f"RAGLINE_REDIS_URL: unknown scheme {scheme!r}")
        return RedisTarget(url=url)
    tls = SENTINEL_SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = _sentinel_hosts(hostlist)
    segments = [s for s in path.split("/") if s]
    if not segments or len(segments) > 2:
        raise InvalidRedisUrl(
            "a Sentinel URL's path is /MASTER or /MASTER/DB (the name the sentinels monitor)"
        )
    master = unquote(segments[0])
    try:
        db = int(segments[1]) if len(segments) == 2 else 0
    except ValueError:
        raise InvalidRedisUrl(f"a Sentinel URL's database must be a number, not {segments[1]!r}") from None
    if db < 0:
        raise InvalidRedisUrl("a Sentinel URL's database must not be negative")
    options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise InvalidRedisUrl(
            f"a Sentinel URL takes the options {', '.join(_OPTIONS)}; not {', '.join(unknown)}"
        )
    tls_options = tuple((k, options[k]) for k in _TLS_OPTIONS if k in options)
    if tls_options and not tls:
        raise InvalidRedisUrl("ssl_* options need the rediss+sentinel:// scheme (TLS)")
    if options.get("ssl_cert_reqs", "required") not in _CERT_REQS:
        raise InvalidRedisUrl(f"ssl_cert_reqs is one of {', '.join(_CERT_REQS)}")
    return RedisTarget(
        url=url,
        sentinels=sentinels,
        master=master,
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or sentinel_password or None,
        tls=tls,
        tls_options=tls_options,
    )
