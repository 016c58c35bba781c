"""What a browser can be made to do to this API, refused at the door (before the key and the
buckets, so a refusal costs no Redis round trip):

- **DNS rebinding**: a page on a name its owner then points at this API's address reads it as its
  own origin. Every request's ``Host`` must be a name the API answers to
  (``RAGLINE_ALLOWED_HOSTS``) or the address it is bound to (421 otherwise).
- **Cross-site writes**: a page elsewhere may send a form (multipart, no preflight) with the
  visitor's network position, which matters where keys are off (``ragline demo``). An unsafe
  request that names an ``Origin`` must come from a page on the host it is sent to (403 otherwise). JSON
  bodies need their ``Content-Type`` (415 otherwise: the validate step), which no form can send
  without a preflight this API never grants.
- **Framing and sniffing**: every response says ``X-Content-Type-Options: nosniff`` and
  ``X-Frame-Options: DENY``, and carries a ``Content-Security-Policy`` that forbids framing unless
  the route set its own (the pages do, as strict, with what they load).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from ragline.api.errors import ApiError, error_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Nothing of a JSON answer is a document to render: no frame, no script, no load.
DEFAULT_POLICY = "default-src 'none'; frame-ancestors 'none'"
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
]
_CSP = b"content-security-policy"
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})


def host_of(authority: str) -> str:
    """The host of a ``Host`` header or an origin's authority, lowercased, without its port or a
    final dot (``[::1]:8000`` → ``::1``)."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    if authority.count(":") == 1:
        authority = authority.partition(":")[0]
    return authority.rstrip(".")


class AllowedHosts:
    """The names an API answers to: exact names, ``*.domain`` (its subdomains), ``*`` (any), and
    the address it is bound to."""

    def __init__(self, names: Iterable[str], bound_address: str) -> None:
        listed = {host_of(n) if not n.startswith("*.") else n.lower() for n in names}
        self.any = "*" in listed
        self.suffixes = tuple(n[1:] for n in listed if n.startswith("*."))
        self.names = frozenset(n for n in listed if not n.startswith("*"))
        bound = host_of(bound_address)
        self.bound = None if bound in _WILDCARD_ADDRESSES else bound

    def allows(self, host: str, arrived_on: str | None) -> bool:
        """Whether ``host`` (from :func:`host_of`) is one of these, for a connection that
        ``arrived_on`` this local address (what a wildcard bind is bound to)."""
        if self.any or host in self.names or host.endswith(self.suffixes):
            return True
        if host == self.bound:
            return True
        # Bound to every address: the one this connection came in on is ours. (An IP literal is
        # never a rebound name: a page at it is this API's own origin.)
        return self.bound is None and arrived_on is not None and _same_address(host, arrived_on)


def _same_address(host: str, address: str) -> bool:
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(address)
    except ValueError:
        return False


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class BrowserGuard:
    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str], bound_address: str) -> None:
        self.app = app
        self.hosts = AllowedHosts(allowed_hosts, bound_address)

    def refusal(self, scope: Scope) -> ApiError | None:
        host = _header(scope, b"host")
        server = scope.get("server")
        arrived_on = server[0] if server else None
        # A request without a Host (HTTP/1.0) comes from no browser.
        if host is not None and not self.hosts.allows(host_of(host), arrived_on):
            return ApiError(
                421,
                "unknown_host",
                f"this API does not answer to Host {host[:100]!r}: reach it by a name in "
                "RAGLINE_ALLOWED_HOSTS, or add this one there",
            )
        if scope["method"] in _UNSAFE_METHODS:
            origin = _header(scope, b"origin")
            # Hosts alone are compared: behind a proxy that ends TLS, the scheme and port the
            # browser used are not this request's.
            if origin is not None and (host is None or _origin_host(origin) != host_of(host)):
                return ApiError(
                    403,
                    "cross_origin",
                    f"a {scope['method']} from a page of another origin ({origin[:100]!r}) is not "
                    "accepted: call the API from its own pages, or from a program",
                )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self.refusal(scope)
        if refused is not None:
            scope["state"]["refused"] = True
            response = error_response(refused, scope["state"].get("request_id"), path=scope["path"])
            await response(scope, receive, _securing(send))
            return
        await self.app(scope, receive, _securing(send))


def _origin_host(origin: str) -> str | None:
    """An ``Origin``'s host (``null``, from a sandbox or a file, has none)."""
    netloc = urlsplit(origin.strip()).netloc
    return host_of(netloc) if netloc else None


def _securing(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            headers += _SECURITY_HEADERS
            if not any(name.lower() == _CSP for name, _ in headers):
                headers.append((_CSP, DEFAULT_POLICY.encode()))
            message["headers"] = headers
        await send(message)

    return sending
