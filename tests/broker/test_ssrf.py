"""The SSRF guard refuses every non-public target, resolved names included, unless allowlisted."""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest

from broker import ssrf
from broker.ssrf import WebhookRefused, check_url


def _check(url: str, allowlist: tuple[str, ...] = ()) -> ssrf.Target:
    return check_url(url, allowlist=allowlist, timeout_s=2.0)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://127.0.0.1/hook", "loopback"),
        ("http://127.0.0.2:8080/hook", "loopback"),
        ("http://localhost:9000/hook", "loopback"),  # a name that resolves to 127.0.0.1
        ("http://LOCALHOST./hook", "loopback"),
        ("http://0177.0.0.1/hook", "loopback"),  # octal spelling, resolved by the C library
        ("http://2130706433/hook", "loopback"),  # 127.0.0.1 as one integer
        ("http://[::1]/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4-mapped IPv6
        ("http://[64:ff9b::a00:1]/hook", "private"),  # NAT64 of 10.0.0.1
        ("http://10.1.2.3/hook", "private"),
        ("http://172.16.0.1/hook", "private"),
        ("http://192.168.1.1/hook", "private"),
        ("http://[fd12:3456::1]/hook", "private"),
        ("http://169.254.10.10/hook", "link-local"),
        ("http://[fe80::1]/hook", "link-local"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://100.64.0.1/hook", "carrier-grade NAT"),
        ("http://100.127.255.254/hook", "carrier-grade NAT"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://224.0.0.1/hook", "multicast"),
        ("http://240.0.0.1/hook", "reserved"),
    ],
)
def test_non_public_targets_are_refused(url: str, needle: str) -> None:
    with pytest.raises(WebhookRefused) as info:
        _check(url)
    assert needle in str(info.value).partition("is not public: ")[2], str(info.value)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("ftp://example.com/hook", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("gopher://127.0.0.1:6379/_INFO", "http or https"),
        ("//example.com/hook", "http or https"),
        ("https:///nohost", "no host"),
        ("https://user:pw@8.8.8.8/hook", "credentials"),
        ("https://8.8.8.8:99999/hook", "valid URL"),
        ("https://8.8.8.8/" + "a" * 2100, "longer"),
    ],
)
def test_malformed_or_non_http_urls_are_refused(url: str, needle: str) -> None:
    with pytest.raises(WebhookRefused, match=needle):
        _check(url)


def test_public_ip_literal_passes_without_dns() -> None:
    target = _check("https://8.8.8.8/hook?x=1")
    assert target.addresses == ("8.8.8.8",)
    assert (target.scheme, target.host, target.port, target.allowlisted) == ("https", "8.8.8.8", 443, False)
    assert _check("http://[2001:4860:4860::8888]:8080/").port == 8080


def test_allowlisted_host_bypasses_the_address_check() -> None:
    target = _check("http://LocalHost:8123/hook", allowlist=("localhost",))
    assert target.allowlisted and target.addresses == ()
    # only that exact host: another name for the same address is still refused
    with pytest.raises(WebhookRefused):
        _check("http://127.0.0.1:8123/hook", allowlist=("localhost",))


def _fake_dns(monkeypatch: pytest.MonkeyPatch, answers: list[str], delay_s: float = 0.0) -> None:
    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list:
        time.sleep(delay_s)
        out = []
        for a in answers:
            ip = ipaddress.ip_address(a)
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            sockaddr = (a, port, 0, 0) if ip.version == 6 else (a, port)
            out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
        return out

    monkeypatch.setattr(ssrf.socket, "getaddrinfo", getaddrinfo)


def test_a_name_with_public_addresses_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"])
    target = _check("https://hooks.example.com/in")
    assert target.host == "hooks.example.com"
    assert target.addresses == ("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")


def test_one_private_answer_among_public_ones_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, ["93.184.215.14", "10.0.0.5"])
    with pytest.raises(WebhookRefused, match=r"10\.0\.0\.5"):
        _check("https://hooks.example.com/in")


def test_slow_dns_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, ["93.184.215.14"], delay_s=2.0)
    started = time.monotonic()
    with pytest.raises(WebhookRefused, match="within"):
        check_url("https://slow.example.com/", allowlist=(), timeout_s=0.2)
    assert time.monotonic() - started < 1.0


def test_unresolvable_name_is_refused() -> None:
    with pytest.raises(WebhookRefused, match="resolve"):
        _check("https://no-such-host.invalid/hook")
