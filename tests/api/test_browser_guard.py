"""The browser guard on a narrow fake app: which Host and Origin it refuses, and the headers every
response leaves with."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from ragline.api.browser_guard import DEFAULT_POLICY, AllowedHosts, BrowserGuard, host_of
from starlette.types import Message, Receive, Scope, Send

DEFAULTS = ["localhost", "127.0.0.1", "::1"]


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _page(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"<html>"})


def _call(
    headers: dict[str, str],
    *,
    method: str = "GET",
    bound: str = "127.0.0.1",
    allowed: list[str] = DEFAULTS,
    server: tuple[str, int] = ("127.0.0.1", 8000),
    app: Any = _ok,
) -> tuple[int, dict[str, str], bytes]:
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": "/v1/query",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "server": server,
        "state": {"request_id": "r1"},
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(BrowserGuard(app, allowed_hosts=allowed, bound_address=bound)(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


@pytest.mark.parametrize(
    ("authority", "host"),
    [("LocalHost:8000", "localhost"), ("[::1]:8000", "::1"), ("[::1]", "::1"), ("a.example.", "a.example")],
)
def test_host_of(authority: str, host: str) -> None:
    assert host_of(authority) == host


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST"])
def test_loopback_names_are_answered(host: str) -> None:
    assert _call({"Host": host})[0] == 200


def test_a_rebound_name_is_refused_before_the_app() -> None:
    status, headers, body = _call({"Host": "attacker.example:8000"})
    assert status == 421 and "RAGLINE_ALLOWED_HOSTS" in json.loads(body)["message"]
    assert headers["x-frame-options"] == "DENY" and headers["x-request-id"] == "r1"


def test_the_bound_address_and_with_a_wildcard_bind_the_address_arrived_on() -> None:
    assert _call({"Host": "10.1.2.3:8000"}, bound="10.1.2.3")[0] == 200
    assert _call({"Host": "10.1.2.3:8000"}, bound="0.0.0.0", server=("10.1.2.3", 8000))[0] == 200
    assert _call({"Host": "10.9.9.9:8000"}, bound="0.0.0.0", server=("10.1.2.3", 8000))[0] == 421
    assert _call({"Host": "10.1.2.3:8000"}, bound="127.0.0.1", server=("10.1.2.3", 8000))[0] == 421


def test_listed_names_wildcards_and_any() -> None:
    listed = ["api.example", "*.svc.example"]
    assert _call({"Host": "api.example"}, allowed=listed)[0] == 200
    assert _call({"Host": "ragline.ns.svc.example:80"}, allowed=listed)[0] == 200
    assert _call({"Host": "svc.example"}, allowed=listed)[0] == 421
    assert _call({"Host": "localhost"}, allowed=listed)[0] == 421  # the list replaces the defaults
    assert _call({"Host": "anything.example"}, allowed=["*"])[0] == 200


def test_no_host_is_no_browser() -> None:
    assert _call({})[0] == 200


def test_a_write_from_another_origin_is_refused() -> None:
    here = {"Host": "localhost:8000"}
    assert _call({**here, "Origin": "http://localhost:8000"}, method="POST")[0] == 200
    # Behind a proxy that ends TLS the scheme and port differ; the host is what is compared.
    assert _call({**here, "Origin": "https://localhost"}, method="DELETE")[0] == 200
    status, _, body = _call({**here, "Origin": "https://attacker.example"}, method="POST")
    assert status == 403 and "another origin" in json.loads(body)["message"]
    assert _call({**here, "Origin": "null"}, method="POST")[0] == 403
    # Reads are not writes: a page elsewhere cannot read the answer without CORS anyway.
    assert _call({**here, "Origin": "https://attacker.example"})[0] == 200


def test_every_response_says_nosniff_and_no_frames() -> None:
    _, headers, _ = _call({"Host": "localhost"})
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["content-security-policy"] == DEFAULT_POLICY
    # A page's own policy stays, alone.
    _, headers, _ = _call({"Host": "localhost"}, app=_page)
    assert headers["content-security-policy"] == "default-src 'self'; frame-ancestors 'none'"


def test_allowed_hosts_reads_ports_and_brackets_off_the_list() -> None:
    hosts = AllowedHosts(["[::1]:8000", "API.example"], "0.0.0.0")
    assert hosts.allows("::1", None) and hosts.allows("api.example", None)
    assert hosts.bound is None
