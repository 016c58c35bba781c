"""An open-loop (constant-rate) HTTP load generator: requests leave on schedule, whatever the
server does, so an overloaded server shows up as latency and errors instead of slowing the client
down (a closed loop like wrk's hides overload: each connection waits for its answer).

asyncio + httpx in one process; every request is recorded (send time, latency, status). Bounded
in count and time, loopback only. wrk2 would do this in C but is not packaged here.
"""

from __future__ import annotations

import asyncio
import gc
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
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int, scheduled: float) -> None:
            payload = body(i)
            sent = loop.time()
            status, degraded = -1, False
            try:
                reply = await client.post(url, json=payload, headers=headers[who[i]])
                status = reply.status_code
                if status == 200:
                    degraded = bool(reply.json().get("degraded"))
            except httpx.TimeoutException:
                status = 0
            except httpx.HTTPError:
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
            degraded = reply.status_code == 200 and bool(reply.json().get("degraded"))
            out.append(
                Sample(sent - start, 0.0, time.monotonic() - sent, reply.status_code, 0, True, degraded)
            )
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
