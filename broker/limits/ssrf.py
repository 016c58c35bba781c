"""The SSRF guard for webhook URLs: http(s) only, and every address the host resolves to public.

Checked when a job is submitted (422) and again before each delivery attempt, and the delivery
then connects to the address checked here, so DNS that changes in between (rebinding) cannot
steer a delivery into the private network. Hostnames in ``webhook_host_allowlist`` skip the
address check (tests, or a receiver deliberately inside the network).

Lookups run on a :class:`Resolver`: a bounded pool with a bounded queue, where a lookup that
hangs is written off instead of holding its thread's place.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ragline.broker.errors import RaglineError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Cloud metadata endpoints; link-local and ULA already cover these, named to be explicit.
_METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


class WebhookRefused(RaglineError, ValueError):
    """The URL is not an acceptable webhook target; the message says why."""


class ResolverBusy(WebhookRefused):
    """No lookup slot came free in time: the resolver is saturated, which says nothing about the
    URL (a delivery waits and tries again without spending an attempt)."""


AddrInfo = list[tuple[Any, ...]]


@dataclass(eq=False)
class _Lookup:
    host: str
    port: int
    future: Future[AddrInfo] = field(default_factory=Future)
    replaced: bool = False  # its caller gave up while it ran; another thread took its place


class Resolver:
    """``getaddrinfo`` (which takes no timeout) on at most ``threads`` threads, with at most
    ``queued`` lookups waiting. A lookup whose caller gave up before it started leaves the queue.
    One that outlives its caller's timeout inside the C library is written off: a fresh thread
    takes its place at once and the stuck one leaves once the library returns, so hanging names
    do not keep the pool's capacity. At most ``max_stuck`` are written off at a time (a resolver
    that never answers must not grow threads without end); past that the pool shrinks until they
    return, and callers get :class:`ResolverBusy`."""

    def __init__(self, *, threads: int = 4, queued: int = 64, max_stuck: int | None = None) -> None:
        self._threads = threads
        self._queued = queued
        self._max_stuck = threads if max_stuck is None else max_stuck
        self._ready = threading.Condition()
        self._waiting: deque[_Lookup] = deque()
        self._live = 0  # threads taking lookups
        self.stuck = 0  # threads written off, still inside getaddrinfo

    def lookup(self, host: str, port: int, timeout_s: float) -> AddrInfo:
        job = _Lookup(host, port)
        with self._ready:
            if len(self._waiting) >= self._queued:
                raise ResolverBusy(f"the DNS resolver is saturated (looking up {host!r})")
            self._waiting.append(job)
            self._grow()
            self._ready.notify()
        try:
            return job.future.result(timeout=timeout_s)
        except FutureTimeout:
            pass
        with self._ready:
            if job in self._waiting:  # it never started: the pool was busy, not the name slow
                self._waiting.remove(job)
                raise ResolverBusy(f"no DNS lookup slot came free within {timeout_s:g}s for {host!r}")
            if not job.future.done() and self.stuck < self._max_stuck:
                job.replaced = True
                self.stuck += 1
                self._live -= 1
                self._grow()
        if job.future.done():
            return job.future.result()
        raise WebhookRefused(f"could not resolve {host!r} within {timeout_s:g}s")

    def _grow(self) -> None:  # holding self._ready
        while self._live < self._threads:
            self._live += 1
            threading.Thread(target=self._work, name="ssrf-dns", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                job = self._waiting.popleft()
            try:
                job.future.set_result(socket.getaddrinfo(job.host, job.port, 0, socket.SOCK_STREAM))
            except BaseException as exc:
                job.future.set_exception(exc)
            with self._ready:
                if job.replaced:  # written off meanwhile: its place is taken, so it leaves
                    self.stuck -= 1
                    return


# The process's resolver; the callbacks worker sizes its own (configure_resolver).
_resolver = Resolver()


def configure_resolver(*, threads: int, queued: int) -> Resolver:
    global _resolver
    _resolver = Resolver(threads=threads, queued=queued)
    return _resolver


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    scheme: str
    host: str  # lower-cased hostname or IP literal, without brackets
    port: int
    addresses: tuple[str, ...]  # checked addresses, in resolver order; empty when allowlisted
    allowlisted: bool


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address, or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            why = refusal(inner)
            return f"{why} (inside {ip})" if why else None
    if ip in _METADATA:
        return f"{ip} is a cloud metadata address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return f"{ip} is a carrier-grade NAT address"
    for attr, what in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        # IPv6 only (fec0::/10): deprecated, yet routed inside some networks, and neither private
        # nor non-global to the standard library.
        ("is_site_local", "site-local"),
        ("is_unspecified", "unspecified"),
        ("is_multicast", "multicast"),
        ("is_reserved", "reserved"),
        ("is_private", "private"),
    ):
        if getattr(ip, attr, False):
            return f"{ip} is a {what} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


def _parse(url: str) -> tuple[str, str, int]:
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRefused(f"webhook_url is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook_url is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookRefused("webhook_url must be an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("webhook_url must not carry credentials")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise WebhookRefused("webhook_url has no host")
    if port == 0:
        # Not "the default port": what a connection to port 0 reaches is up to the platform.
        raise WebhookRefused("webhook_url's port must be between 1 and 65535, not 0")
    return scheme, host, port or (443 if scheme == "https" else 80)


def _resolve(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = _resolver.lookup(host, port, timeout_s)
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused(f"could not resolve {host!r}: {exc}") from None
    seen: dict[str, IPAddress] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        # sockaddr[0] may carry an IPv6 zone ("fe80::1%eth0"): the address is what counts.
        text = str(sockaddr[0]).split("%", 1)[0]
        seen.setdefault(text, ipaddress.ip_address(text))
    if not seen:
        raise WebhookRefused(f"{host!r} resolves to no address")
    return list(seen.values())


def check_url(url: str, *, allowlist: list[str] | tuple[str, ...], timeout_s: float) -> Target:
    """The URL as a :class:`Target`, or :class:`WebhookRefused` (:class:`ResolverBusy` when the
    resolver had no room for the lookup). Blocks up to ``timeout_s`` on DNS."""
    scheme, host, port = _parse(url)
    if host in {h.lower().rstrip(".") for h in allowlist}:
        return Target(url, scheme, host, port, (), True)
    addresses = _resolve(host, port, timeout_s)
    # All of them: a client may connect to any address a name resolves to.
    for ip in addresses:
        why = refusal(ip)
        if why:
            raise WebhookRefused(f"webhook host {host!r} is not public: {why}")
    return Target(url, scheme, host, port, tuple(str(ip) for ip in addresses), False)
