"""The SSRF guard for webhook URLs: http(s) only, and every address the host resolves to public.

Checked when a job is submitted (422) and again before each delivery attempt, and the delivery
then connects to the address checked here, so DNS that changes in between (rebinding) cannot
steer a delivery into the private network. Hostnames in ``webhook_host_allowlist`` skip the
address check (tests, or a receiver deliberately inside the network).
"""

from __future__ import annotations

import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Cloud metadata endpoints; link-local and ULA already cover these, named to be explicit.
_METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})

# getaddrinfo cannot be given a timeout: run it on a few threads and stop waiting instead.
_resolver = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ssrf-dns")


class WebhookRefused(ValueError):
    """The URL is not an acceptable webhook target; the message says why."""


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
        ("is_unspecified", "unspecified"),
        ("is_multicast", "multicast"),
        ("is_reserved", "reserved"),
        ("is_private", "private"),
    ):
        if getattr(ip, attr):
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
    return scheme, host, port or (443 if scheme == "https" else 80)


def _resolve(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    future = _resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout_s)
    except FutureTimeout:
        raise WebhookRefused(f"could not resolve {host!r} within {timeout_s:g}s") from None
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
    """The URL as a :class:`Target`, or :class:`WebhookRefused`. Blocks up to ``timeout_s`` on DNS."""
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
