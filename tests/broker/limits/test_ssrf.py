"""The SSRF guard refuses every non-public target, resolved names included, unless allowlisted."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ragline.broker.limits import ssrf
from ragline.broker.limits.ssrf import ResolverBusy, WebhookRefused, check_url


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
        # Deprecated site-local (RFC 3879): still routed inside some networks, and not private
        # to Python's ipaddress (nor marked non-global).
        ("http://[fec0::1]/hook", "site-local"),
        ("http://[feff:ffff::1]/hook", "site-local"),
        ("http://[fec0::a9fe:a9fe]/hook", "site-local"),
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
        # Port 0 is no port: connecting to it is up to the platform (or another default).
        ("https://8.8.8.8:0/hook", "port"),
        ("http://[2001:4860:4860::8888]:0/", "port"),
        ("http://example.com:00/hook", "port"),
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


def _fake_dns(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> None:
    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list:
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
    """The check gives up while the lookup still hangs: had it waited for DNS, the lookup would
    have answered (after 30 s) and the URL passed."""
    release = threading.Event()
    _hanging_dns(monkeypatch, release)
    try:
        with pytest.raises(WebhookRefused, match=r"could not resolve 'slow.example.com' within 0.2s"):
            check_url("https://slow.example.com/", allowlist=(), timeout_s=0.2)
    finally:
        release.set()


def test_unresolvable_name_is_refused() -> None:
    with pytest.raises(WebhookRefused, match="resolve"):
        _check("https://no-such-host.invalid/hook")


def _hanging_dns(monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> list[str]:
    """``ok.example`` resolves at once; any other name hangs in the C library until ``release``.
    Returns the names looked up so far."""
    asked: list[str] = []

    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list:
        asked.append(host)
        if host != "ok.example":
            release.wait(30)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port))]

    monkeypatch.setattr(ssrf.socket, "getaddrinfo", getaddrinfo)
    return asked


def _refusal(url: str, timeout_s: float = 0.2) -> WebhookRefused:
    try:
        check_url(url, allowlist=(), timeout_s=timeout_s)
    except WebhookRefused as exc:
        return exc
    raise AssertionError(f"{url} was accepted")


def test_hanging_lookups_do_not_keep_the_resolvers_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    """As many names as the resolver has threads hang (each given up on): a good name then still
    resolves, where it used to queue behind them and fail as if it could not be resolved."""
    release = threading.Event()
    _hanging_dns(monkeypatch, release)
    try:
        with ThreadPoolExecutor(4) as pool:
            refused = list(pool.map(_refusal, [f"https://hang-{i}.example/" for i in range(4)]))
        assert all("could not resolve" in str(e) and not isinstance(e, ResolverBusy) for e in refused)
        assert check_url("https://ok.example/", allowlist=(), timeout_s=1.0).addresses == ("93.184.215.14",)
    finally:
        release.set()


def test_a_saturated_resolver_says_busy_not_unresolvable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its written-off budget the pool shrinks: a lookup left waiting is ResolverBusy (the
    delivery waits without spending an attempt), and with the queue full one is refused at once."""
    release = threading.Event()
    asked = _hanging_dns(monkeypatch, release)
    resolver = ssrf.Resolver(threads=1, queued=1, max_stuck=0)
    try:
        with pytest.raises(WebhookRefused, match="could not resolve") as hung:
            resolver.lookup("hang.example", 443, 0.2)  # runs, hangs, is given up on, not replaced
        assert not isinstance(hung.value, ResolverBusy)
        with pytest.raises(ResolverBusy, match="no DNS lookup slot came free"):
            resolver.lookup("ok.example", 443, 0.2)  # waits behind it, leaves the queue
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(resolver.lookup, "ok.example", 443, 30.0)
            deadline = time.monotonic() + 5
            while not resolver._waiting:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(ResolverBusy, match="saturated"):
                resolver.lookup("ok.example", 443, 30.0)  # the queue is full: no wait at all
            release.set()  # the hung lookup returns; its thread takes the waiting one
            assert waiting.result(timeout=5)[0][4][0] == "93.184.215.14"
        assert asked == ["hang.example", "ok.example"]  # the abandoned lookup never ran
    finally:
        release.set()


def test_a_written_off_thread_leaves_once_its_lookup_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    _hanging_dns(monkeypatch, release)
    resolver = ssrf.Resolver(threads=1, queued=4, max_stuck=1)
    before = threading.active_count()
    try:
        with pytest.raises(WebhookRefused, match="could not resolve"):
            resolver.lookup("hang.example", 443, 0.2)
        assert resolver.stuck == 1
        assert resolver.lookup("ok.example", 443, 1.0)  # on the thread that took its place
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while resolver.stuck or threading.active_count() > before + 1:
        assert time.monotonic() < deadline, (resolver.stuck, threading.active_count(), before)
        time.sleep(0.01)
