"""An open-loop (constant-rate) HTTP load generator: requests leave on schedule, whatever the
server does, so an overloaded server shows up as latency and errors instead of slowing the client
down (a closed loop like wrk's hides overload: each connection waits for its answer).

asyncio in one process, speaking HTTP/1.1 over keep-alive connections itself: a rejection takes
the server a millisecond or two, and httpx's own work per request was as much again, counted as
the server's latency. Every request is recorded (send time, latency, status). Bounded in count
and time, loopback only. wrk2 would do this in C but is not packaged here.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_REQUESTS = 20_000


@dataclass(slots=True)
class Sample:
    sent: float  # seconds since the run began, when the request actually left
    lag: float  # how late it left against its schedule (the generator's own delay)
    latency: float  # seconds from leaving to the whole response (or to the timeout)
    status: int  # HTTP status; 0 = client timeout, -1 = transport error
    key: int  # which API key sent it
    allow_degraded: bool
    degraded: bool = False
    predicted_wait: float = math.nan  # admission's predicted wait (s) that the answer reports, if any

    @property
    def outcome(self) -> str:
        if self.status == 200:
            return "degraded" if self.degraded else "full"
        if self.status == 0:
            return "timeout"
        if self.status == -1:
            return "transport_error"
        if self.status in (429, 503):
            return str(self.status)
        return "other_5xx" if self.status >= 500 else f"other_{self.status}"


def predicted_wait(answer: dict[str, Any]) -> float:
    """The predicted wait (s) an answer's timings report (ragline's ``predicted_wait_ms``); nan if none."""
    ms = (answer.get("timings") or {}).get("predicted_wait_ms")
    return math.nan if ms is None else float(ms) / 1000


def _weighted(shares: list[float], n: int) -> list[int]:
    """Which key sends each of n requests: smooth weighted round robin (deterministic)."""
    credit = [0.0] * len(shares)
    total = sum(shares)
    out = []
    for _ in range(n):
        for k, share in enumerate(shares):
            credit[k] += share
        k = max(range(len(shares)), key=credit.__getitem__)
        credit[k] -= total
        out.append(k)
    return out


def _head(netloc: str, headers: dict[str, str]) -> bytes:
    """The request's fixed header lines (Content-Length is added per request)."""
    lines = [f"Host: {netloc}", "Content-Type: application/json", "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode()


class _Pool:
    """Keep-alive HTTP/1.1 connections to one server: one request at a time on each, as many
    connections as requests in flight. Knows just enough HTTP for a JSON API on loopback."""

    # uvicorn closes a connection idle for 5 s: reuse only ones idle for less.
    MAX_IDLE_S = 2.0

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> _Pool:
        return self

    async def __aexit__(self, *_: object) -> None:
        for _at, _reader, writer in self._idle:
            writer.close()
        self._idle.clear()

    def _reusable(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        now = time.monotonic()
        while self._idle:
            at, reader, writer = self._idle.pop()
            if now - at < self.MAX_IDLE_S and not reader.at_eof():
                return reader, writer
            writer.close()
        return None

    async def post(self, path: str, body: bytes, head: bytes) -> tuple[int, bytes]:
        reused = self._reusable()
        if reused is not None:
            try:
                return await self._exchange(*reused, path, body, head)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if getattr(exc, "partial", b""):
                    raise  # the server began to answer: not a stale connection
            # The server closed it while idle: once more on a new connection.
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return await self._exchange(reader, writer, path, body, head)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: bytes, head: bytes
    ) -> tuple[int, bytes]:
        try:
            request_line = b"POST %s HTTP/1.1\r\n" % path.encode()
            writer.write(request_line + head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            status_line = await reader.readuntil(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            length, keep_alive = 0, status_line.startswith(b"HTTP/1.1")
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    keep_alive = value.strip().lower() == b"keep-alive"
                elif name == b"transfer-encoding":
                    raise ValueError("chunked responses are not supported here")
            reply = await reader.readexactly(length)
        except BaseException:
            writer.close()  # a timeout or error mid-reply leaves the connection unusable
            raise
        if keep_alive:
            self._idle.append((time.monotonic(), reader, writer))
        else:
            writer.close()
        return status, reply


async def _open_loop(
    url: str,
    *,
    rate: float,
    duration_s: float,
    body: Callable[[int], dict[str, Any]],
    headers: list[dict[str, str]],
    shares: list[float],
    timeout_s: float,
) -> list[Sample]:
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("the open-loop generator only targets loopback")
    n = min(MAX_REQUESTS, max(1, round(rate * duration_s)))
    who = _weighted(shares, n)
    samples: list[Sample] = []
    parts = urlsplit(url)
    path = parts.path or "/"
    heads = [_head(parts.netloc, h) for h in headers]
    async with _Pool(parts.hostname or "127.0.0.1", parts.port or 80) as pool:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int, scheduled: float) -> None:
            payload = body(i)
            encoded = json.dumps(payload).encode()
            sent = loop.time()
            status, degraded, predicted = -1, False, math.nan
            try:
                async with asyncio.timeout(timeout_s):
                    status, reply = await pool.post(path, encoded, heads[who[i]])
                if status == 200:
                    answer = json.loads(reply)
                    degraded, predicted = bool(answer.get("degraded")), predicted_wait(answer)
            except TimeoutError:
                status = 0
            except (OSError, asyncio.IncompleteReadError, ValueError):
                status = -1
            samples.append(
                Sample(
                    sent=sent - start,
                    lag=sent - scheduled,
                    latency=loop.time() - sent,
                    status=status,
                    key=who[i],
                    allow_degraded=bool(payload.get("allow_degraded", True)),
                    degraded=degraded,
                    predicted_wait=predicted,
                )
            )

        tasks = []
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, scheduled)))
        await asyncio.gather(*tasks)
    samples.sort(key=lambda s: s.sent)
    return samples


def open_loop(
    url: str,
    *,
    rate: float,
    duration_s: float,
    body: Callable[[int], dict[str, Any]],
    headers: list[dict[str, str]],
    shares: list[float] | None = None,
    timeout_s: float = 30.0,
) -> list[Sample]:
    """Send ``rate`` requests per second for ``duration_s`` and wait for every answer (or timeout).

    The collector is off for the run (a few thousand requests fit in memory): a full collection
    in the generator would be counted as the server's latency.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return asyncio.run(
            _open_loop(
                url,
                rate=rate,
                duration_s=duration_s,
                body=body,
                headers=headers,
                shares=shares or [1.0] * len(headers),
                timeout_s=timeout_s,
            )
        )
    finally:
        gc.enable()
        gc.unfreeze()


def sequential(
    url: str,
    *,
    n: int,
    body: Callable[[int], dict[str, Any]],
    headers: dict[str, str],
    timeout_s: float = 60.0,
) -> list[Sample]:
    """One request at a time: the unloaded latency."""
    out = []
    with httpx.Client(timeout=timeout_s) as client:
        start = time.monotonic()
        for i in range(n):
            sent = time.monotonic()
            reply = client.post(url, json=body(i), headers=headers)
            answer = reply.json() if reply.status_code == 200 else {}
            latency = time.monotonic() - sent
            degraded, predicted = bool(answer.get("degraded")), predicted_wait(answer)
            out.append(Sample(sent - start, 0.0, latency, reply.status_code, 0, True, degraded, predicted))
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
