"""bench/faults/run.py's scenarios: each injects one fault into a running :class:`FaultStack` and
returns a :class:`Result` (its JSON figure, whether the issue's pass condition held, and what
was seen). Durations come from :class:`Durations`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import select
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis

from bench.faults.receivers import running_receiver, running_tricklers
from bench.faults.scenarios_base import FINALS, MIB, Durations, Result, Unique, query_body, wait_job
from bench.faults.scenarios_ingest import ingest_fair, ingest_quadratic
from bench.faults.stack import HUNG_HOST, HUNG_HOSTS, TRICKLE_HOST, FaultStack
from bench.openloop import open_loop, percentile, sequential
from bench.overload import find_capacity

# -- SSE -------------------------------------------------------------------------------------


@dataclass
class Stream:
    status: int
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    request_id: str = ""
    error: str = ""
    last_id: str = ""  # the last event's id: where a resume (Last-Event-ID) starts after

    @property
    def finals(self) -> list[str]:
        return [e for e, _ in self.events if e in FINALS]

    @property
    def tokens(self) -> int:
        return sum(1 for e, _ in self.events if e == "token")

    def joined(self) -> str:
        """The answer a reader joins: the tokens after the last ``restart``."""
        text = ""
        for event, data in self.events:
            if event == "restart":
                text = ""
            elif event == "token":
                text += data["text"]
        return text

    def done(self) -> dict[str, Any] | None:
        return next((d for e, d in self.events if e == "done"), None)


def read_stream(
    client: httpx.Client, method: str, url: str, *, into: Stream | None = None, **kw: Any
) -> Stream:
    """Every event of one SSE response (appended to ``into`` as they arrive, for a watcher)."""
    stream = into or Stream(0)
    try:
        with client.stream(method, url, **kw) as reply:
            stream.status = reply.status_code
            stream.request_id = reply.headers.get("x-request-id", "")
            if reply.status_code != 200:
                stream.error = reply.read().decode(errors="replace")[:200]
                return stream
            event: str | None = None
            data: list[str] = []
            for line in reply.iter_lines():
                if not line:
                    if event is not None:
                        stream.events.append((event, json.loads("\n".join(data))))
                    event, data = None, []
                elif line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif line.startswith("id: "):
                    stream.last_id = line[4:]
    except httpx.HTTPError as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    return stream


# -- chunked_413 -------------------------------------------------------------------------------


def chunked_post(base: str, path: str, headers: dict[str, str], total: int, chunk: int = 64 * 1024) -> int:
    """POST ``total`` bytes of an unfinished JSON string in chunks, as fast as the server reads
    them, until it answers; the answer's status (0: it hung up without one)."""
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    head += ["Transfer-Encoding: chunked", *(f"{k}: {v}" for k, v in headers.items())]
    piece = b"a" * chunk
    frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        try:
            first = b'{"query": "'
            sock.sendall(f"{len(first):x}\r\n".encode() + first + b"\r\n")
            while sent < total:
                if select.select([sock], [], [], 0)[0]:
                    break  # it answered (or hung up) before the end of the body
                sock.sendall(frame)
                sent += len(piece)
            else:
                sock.sendall(b'2\r\n"}\r\n0\r\n\r\n')
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while b"\r\n" not in answer:
                data = sock.recv(4096)
                if not data:
                    break
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    status_line = answer.split(b"\r\n", 1)[0].split()
    return int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0


def chunked_413(stack: FaultStack, d: Durations) -> Result:
    headers = stack.key("chunked")
    paths = ("/v1/query", "/v1/query/stream", "/v1/jobs")
    chunked_post(stack.base, "/v1/query", headers, 1 * MIB)  # the first request pays for warm-up
    before = stack.rss("api")
    statuses = {path: chunked_post(stack.base, path, headers, 10 * MIB) for path in paths}
    time.sleep(1.0)
    growth = stack.rss("api") - before
    ok = all(s == 413 for s in statuses.values()) and growth < 10 * MIB
    seen = ", ".join(f"{p} {s}" for p, s in statuses.items())
    return Result("chunked_413", ok, ok, f"10 MB chunked: {seen}; API RSS {growth / MIB:+.1f} MiB")


# -- cross_key_bytes ---------------------------------------------------------------------------


def cross_key_bytes(stack: FaultStack, d: Durations) -> Result:
    owner, other = stack.key("owner-a"), stack.key("other-b")
    ask = Unique("cross")
    foreign: list[tuple[str, int, int]] = []  # (what, status, bytes of A's that B got)

    def attempts(client: httpx.Client, request_id: str, job_id: str) -> None:
        tries = [
            ("resume request", "GET", f"/v1/query/stream/{request_id}", {}),
            ("resume request after 0", "GET", f"/v1/query/stream/{request_id}", {"Last-Event-ID": "0-0"}),
            ("resume job", "GET", f"/v1/query/stream/{job_id}", {}),
            ("resume chat", "GET", f"/v1/chat/completions/{request_id}/stream", {}),
            ("read job", "GET", f"/v1/jobs/{job_id}", {}),
            ("cancel job", "DELETE", f"/v1/jobs/{job_id}", {}),
        ]
        for what, method, path, extra in tries:
            with client.stream(method, path, headers=other | extra, timeout=10) as reply:
                body = reply.read()
            leaked = len(body) if reply.status_code != 404 else body.count(b"event:") * 100
            foreign.append((what, reply.status_code, leaked))

    with httpx.Client(base_url=stack.base, timeout=240) as client:
        live = Stream(0)
        reader = threading.Thread(
            target=read_stream,
            args=(client, "POST", "/v1/query/stream"),
            kwargs={"into": live, "json": query_body(ask()), "headers": owner},
        )
        reader.start()
        job = client.post("/v1/jobs", json=query_body(ask()), headers=owner).json()
        deadline = time.monotonic() + 120
        while not live.request_id and time.monotonic() < deadline:
            time.sleep(0.05)
        attempts(client, live.request_id, job["job_id"])  # while both are in flight
        reader.join(240)
        view = wait_job(client, job["job_id"], owner, 240)
        attempts(client, live.request_id, job["job_id"])  # and once they are finished
        unknown = time.monotonic()
        status = client.get(f"/v1/query/stream/{uuid.uuid4().hex}", headers=other, timeout=10).status_code
        unknown_s = time.monotonic() - unknown
    leaked = sum(b for _, _, b in foreign)
    not_404 = [f"{w} {s}" for w, s, _ in foreign if s != 404]
    a_ok = live.finals == ["done"] and view.get("status") == "done"
    ok = leaked == 0 and not not_404 and a_ok and status == 404
    detail = (
        f"{len(foreign)} tries by key B: {len(foreign) - len(not_404)} 404"
        + (f" (not 404: {', '.join(not_404)})" if not_404 else "")
        + f"; A's stream {'/'.join(live.finals) or 'no final'}, A's job {view.get('status')}; "
        f"unknown id {status} in {unknown_s * 1000:.0f} ms"
    )
    return Result("cross_key_bytes", leaked, ok, detail)


# -- pool_exhaustion_success -------------------------------------------------------------------


async def _hits(base: str, headers: dict[str, str], body: dict[str, Any], duration_s: float, clients: int):
    """Closed loop: ``clients`` concurrent cache hits for ``duration_s``; (latency, status) each."""
    samples: list[tuple[float, int]] = []
    stop = time.monotonic() + duration_s
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def loop() -> None:
            while time.monotonic() < stop:
                began = time.perf_counter()
                try:
                    status = (await client.post("/v1/query", json=body, headers=headers)).status_code
                except httpx.HTTPError:
                    status = -1
                samples.append((time.perf_counter() - began, status))

        await asyncio.gather(*(loop() for _ in range(clients)))
    return samples


async def _hold_resumes(base: str, headers: dict[str, str], job_id: str, n: int, opened: Counter[int]):
    """``n`` resumes of one stream, each held open (reading) until cancelled."""
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=base, timeout=httpx.Timeout(600, connect=30), limits=limits
    ) as client:

        async def hold() -> None:
            try:
                async with client.stream("GET", f"/v1/query/stream/{job_id}", headers=headers) as reply:
                    opened[reply.status_code] += 1
                    async for _ in reply.aiter_bytes():
                        pass
            except httpx.HTTPError:
                opened[-1] += 1

        await asyncio.gather(*(hold() for _ in range(n)), return_exceptions=True)


def pool_exhaustion(stack: FaultStack, d: Durations, holders: int = 600) -> Result:
    greedy, victim = stack.key("greedy"), stack.key("victim")
    body = query_body(Unique("pool")(), mode="retrieval")
    url = stack.base + "/v1/query"
    warm = sequential(url, n=1, body=lambda i: body, headers=victim)
    assert warm[0].status == 200, warm[0].status
    unloaded = asyncio.run(_hits(stack.base, victim, body, 5.0, 4))
    unloaded_p99 = percentile([lat for lat, s in unloaded if s == 200], 99)

    # A job of the greedy key's own that stays open: its retrieval worker is paused.
    stack.pause("retrieval", True)
    try:
        with httpx.Client(base_url=stack.base, timeout=30) as client:
            reply = client.post(
                "/v1/jobs", json=query_body(Unique("held")(), mode="retrieval"), headers=greedy
            )
        if reply.status_code != 202:
            return Result("pool_exhaustion_success", None, None, f"the held job was refused: {reply.text}")
        job_id = reply.json()["job_id"]
        opened: Counter[int] = Counter()

        async def run() -> list[tuple[float, int]]:
            holding = asyncio.ensure_future(_hold_resumes(stack.base, greedy, job_id, holders, opened))
            deadline = time.monotonic() + 30
            while sum(opened.values()) < holders and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            loaded = await _hits(stack.base, victim, body, d.pool_s, 4)
            holding.cancel()
            return loaded

        loaded = asyncio.run(run())
        with httpx.Client(base_url=stack.base, timeout=30) as client:
            client.delete(f"/v1/jobs/{job_id}", headers=greedy)
    finally:
        stack.pause("retrieval", False)
    ok_lat = [lat for lat, s in loaded if s == 200]
    success = len(ok_lat) / len(loaded) if loaded else 0.0
    p99 = percentile(ok_lat, 99)
    ratio = p99 / unloaded_p99 if ok_lat else math.inf
    passed = success >= 0.999 and ratio <= 2.0
    statuses = Counter(s for _, s in loaded)
    detail = (
        f"greedy key's {holders} resumes: {dict(opened)}; victim {len(loaded)} hits, "
        f"statuses {dict(statuses)}, P99 {p99 * 1000:.1f} ms vs {unloaded_p99 * 1000:.1f} ms unloaded "
        f"({ratio:.2f}×)"
    )
    return Result("pool_exhaustion_success", round(success, 5), passed, detail)


# -- redis_memory_levels_off -------------------------------------------------------------------


async def _at_rate(
    base: str,
    path: str,
    headers: dict[str, str],
    body: Callable[[], dict[str, Any]],
    rate: float,
    duration_s: float,
) -> list[tuple[float, int]]:
    """Open loop at ``rate``/s for ``duration_s``: (seconds since start, status) per request."""
    samples: list[tuple[float, int]] = []
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:

        async def one(at: float) -> None:
            try:
                status = (await client.post(path, json=body(), headers=headers)).status_code
            except httpx.HTTPError:
                status = -1
            samples.append((at, status))

        tasks = []
        for i in range(int(rate * duration_s)):
            await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(time.monotonic() - began)))
        await asyncio.gather(*tasks)
    return samples


def redis_memory(stack: FaultStack, d: Durations, limit_mb: int = 64) -> Result:
    limit = limit_mb * MIB
    rate = stack.settings.api.key_rate_per_s  # the default key's allowed rate, all of it
    headers = stack.key("memory", rate=None, burst=None)
    ask = Unique("memory")
    client = stack.redis
    baseline = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(limit))
    used: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(redis.RedisError):
                used.append(int(client.info("memory")["used_memory"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    async def run() -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
        return await asyncio.gather(
            _at_rate(
                stack.base,
                "/v1/query",
                headers,
                lambda: query_body(ask(), top_k=50, mode="retrieval"),
                rate * 0.75,
                d.memory_s,
            ),
            _at_rate(
                stack.base,
                "/v1/jobs",
                headers,
                lambda: query_body(ask(), top_k=50, mode="retrieval"),
                rate * 0.25,
                d.memory_s,
            ),
        )

    try:
        queries, job_posts = asyncio.run(run())
    finally:
        stop.set()
        watcher.join(3)
        client.config_set("maxmemory", "0")
    samples = queries + job_posts
    statuses = Counter(s for _, s in samples)
    answered = {int(at) for at, s in samples if 200 <= s < 300}
    silent = [s for s in range(int(d.memory_s)) if s not in answered]
    tail = used[-max(3, len(used) // 3) :] if used else [0]
    peak = max(used, default=0)
    levels_off = max(tail) < 0.8 * limit
    errors = sum(n for s, n in statuses.items() if s == -1 or (s >= 500 and s != 503))
    ok = levels_off and not silent and errors == 0
    detail = (
        f"maxmemory {limit_mb} MB (from {baseline / MIB:.1f} MiB used): peak {peak / limit:.0%}, "
        f"last third ≤ {max(tail) / limit:.0%}; {len(samples)} requests at {rate:g}/s {dict(statuses)}; "
        f"seconds without a 2xx: {len(silent)}"
    )
    return Result("redis_memory_levels_off", levels_off and not silent, ok, detail)


# -- redis_restart_lost_jobs -------------------------------------------------------------------


def redis_restart(stack: FaultStack, d: Durations, down_s: float = 3.0) -> Result:
    headers = stack.key("restart")
    ask = Unique("restart")
    statuses: Counter[int] = Counter()
    accepted: list[str] = []
    streams: list[Stream] = []
    stop = threading.Event()
    lock = threading.Lock()

    with running_receiver() as receiver, httpx.Client(base_url=stack.base, timeout=60) as client:

        def count(status: int) -> None:
            with lock:
                statuses[status] += 1

        def jobs_loop() -> None:
            while not stop.wait(0.25):
                job_ref = uuid.uuid4().hex
                body = query_body(ask(), mode="retrieval", webhook_url=receiver.url(job_ref))
                try:
                    reply = client.post("/v1/jobs", json=body, headers=headers)
                except httpx.HTTPError:
                    count(-1)
                    continue
                count(reply.status_code)
                if reply.status_code == 202:
                    accepted.append(reply.json()["job_id"])

        def queries_loop() -> None:
            while not stop.wait(0.25):
                try:
                    count(
                        client.post(
                            "/v1/query", json=query_body(ask(), mode="retrieval"), headers=headers
                        ).status_code
                    )
                except httpx.HTTPError:
                    count(-1)

        def streams_loop() -> None:
            while not stop.wait(0.25):
                s = read_stream(client, "POST", "/v1/query/stream", json=query_body(ask()), headers=headers)
                count(s.status if not s.error or s.status else -1)
                streams.append(s)

        loops = [threading.Thread(target=f, daemon=True) for f in (jobs_loop, queries_loop, streams_loop)]
        for t in loops:
            t.start()
        time.sleep(d.restart_s / 3)
        stack.kill("redis")
        killed = time.monotonic()
        time.sleep(down_s)
        stack.start_redis()
        restarted = time.monotonic()
        # Recovered: a query answered through a worker again (the door alone comes back first).
        recovered = math.nan
        while time.monotonic() - restarted < 120:
            with contextlib.suppress(httpx.HTTPError):
                probe = query_body(ask(), mode="retrieval")
                if client.post("/v1/query", json=probe, headers=headers, timeout=10).status_code == 200:
                    recovered = time.monotonic() - restarted
                    break
            time.sleep(0.1)
        time.sleep(max(0.0, d.restart_s - (time.monotonic() - killed) - d.restart_s / 3))
        stop.set()
        for t in loops:
            t.join(300)
        views = {job_id: wait_job(client, job_id, headers, 180) for job_id in accepted}
        deadline = time.monotonic() + 60
        while len(receiver.paths()) < len(accepted) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # a late duplicate would come now
        deliveries = receiver.delivery_counts()
        died = [c.name for c in stack.supervisor.children if c.proc.poll() is not None]
        died += [f"{k} (no heartbeat)" for k in stack.stale_workers()]
    lost = [j for j, v in views.items() if v.get("status") != "done"]
    duplicates = sum(n - 1 for n in deliveries.values() if n > 1)
    undelivered = len(accepted) - len(receiver.paths())
    server_errors = sum(n for s, n in statuses.items() if s >= 500 and s != 503)
    cut = sum(1 for s in streams if s.status == 200 and len(s.finals) != 1)
    ok = not lost and duplicates == 0 and server_errors == 0 and math.isfinite(recovered)
    detail = (
        f"Redis down {down_s:g} s; {len(accepted)} jobs accepted, lost {len(lost)}"
        + (f" ({Counter(views[j].get('status', '404') for j in lost)})" if lost else "")
        + f", webhooks duplicated {duplicates}, missing {undelivered}; responses {dict(statuses)}; "
        f"streams without one final event {cut}/{len(streams)}; queries answered again "
        f"{recovered:.1f} s after the restart"
        + (f"; did not survive the outage: {', '.join(died)}" if died else "")
    )
    return Result("redis_restart_lost_jobs", len(lost), ok, detail)


# -- worker_kill_stream_ok ---------------------------------------------------------------------


def worker_kill(stack: FaultStack, d: Durations) -> Result:
    headers = stack.key("streams") | {"X-Request-Deadline-Ms": "600000"}
    ask = Unique("kill")
    streams = [Stream(0) for _ in range(d.stream_clients)]
    with httpx.Client(base_url=stack.base, timeout=600) as client:
        readers = [
            threading.Thread(
                target=read_stream,
                args=(client, "POST", "/v1/query/stream"),
                kwargs={"into": s, "json": query_body(ask(), allow_degraded=False), "headers": headers},
            )
            for s in streams
        ]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 180
        while any(s.tokens == 0 and not s.finals for s in streams) and time.monotonic() < deadline:
            time.sleep(0.02)
        mid = sum(1 for s in streams if s.tokens and not s.finals)
        if mid == 0:
            for t in readers:
                t.join(600)
            seen = [f"{s.status} {s.error}".strip() for s in streams]
            return Result(
                "worker_kill_stream_ok", False, False, f"no client mid-answer to kill under: {seen}"
            )
        stack.kill("generation")
        stack.start_worker("generation")
        for t in readers:
            t.join(600)
    restarts = sum(1 for s in streams for e, _ in s.events if e == "restart")
    bad = []
    for i, s in enumerate(streams):
        done = s.done()
        if s.status != 200 or s.finals != ["done"] or done is None or s.joined() != done["answer"]:
            bad.append(f"client {i}: {s.status} finals {s.finals} {s.error}".strip())
    ok = not bad and mid > 0
    detail = f"{len(streams)} SSE clients, {mid} mid-answer at the SIGKILL; {restarts} restart events; " + (
        "each got one done and joined tokens == done.answer" if not bad else "; ".join(bad)
    )
    return Result("worker_kill_stream_ok", ok, ok, detail)


# -- hostile_webhooks_p99_s --------------------------------------------------------------------


def hostile_webhooks(stack: FaultStack, d: Durations, tricklers: int = 20, normal: int = 5) -> Result:
    headers = stack.key("hooks")
    ask = Unique("hooks")
    hung = stack.hung_resolver
    with (
        running_tricklers(tricklers, TRICKLE_HOST, byte_every_s=9.0) as slow,
        running_receiver() as receiver,
        httpx.Client(base_url=stack.base, timeout=60) as client,
    ):
        hostile = list(slow)
        if hung:
            hostile += [f"http://{HUNG_HOST.format(i)}/hook" for i in range(min(tricklers, HUNG_HOSTS))]
        refused: Counter[str] = Counter()
        for url in hostile:
            reply = client.post(
                "/v1/jobs", json=query_body(ask(), mode="retrieval", webhook_url=url), headers=headers
            )
            if reply.status_code != 202:
                refused[f"{reply.status_code} {reply.json().get('error')}"] += 1
        time.sleep(2.0)  # their deliveries are under way
        sent: dict[str, float] = {}
        for i in range(normal):
            path = f"normal-{i}"
            body = query_body(ask(), mode="retrieval", webhook_url=receiver.url(path))
            reply = client.post("/v1/jobs", json=body, headers=headers)
            if reply.status_code == 202:
                sent[path] = time.time()
            time.sleep(1.0)
        deadline = time.monotonic() + 60
        while len(receiver.paths()) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.1)
        waits = [
            (arrived - at) if (arrived := receiver.first_arrival(p)) is not None else math.inf
            for p, at in sent.items()
        ]
    p99 = percentile(waits, 99) if waits else math.inf
    ok = bool(waits) and len(waits) == normal and p99 <= 15.0
    detail = (
        f"{tricklers} receivers trickling a byte every 9 s"
        + (
            f", {min(tricklers, HUNG_HOSTS)} webhooks behind a resolver that never answers"
            if hung
            else " (no hung resolver: it needs root and unshare)"
        )
        + (f"; hostile jobs refused: {dict(refused)}" if refused else "")
        + f"; {normal} normal webhooks: "
        + ", ".join("lost" if math.isinf(w) else f"{w:.1f}" for w in waits)
        + " s"
    )
    return Result(
        "hostile_webhooks_p99_s", None if math.isinf(p99) else round(p99, 2), ok if hung else None, detail
    )


# -- fuzz_5xx ----------------------------------------------------------------------------------


def fuzz(stack: FaultStack, d: Durations) -> Result:
    from bench.faults.fuzz import FUZZ_INDEX, failed_jobs, fuzz_schema

    # It may write one index, so that uploads (multipart included) get past the scope check.
    headers = stack.key("fuzz", scopes=("read", f"write:{FUZZ_INDEX}"))
    report = fuzz_schema(stack.base, headers, max_examples=d.fuzz_examples)
    report.failed_jobs = failed_jobs(stack.base, headers, report, timeout_s=300)
    errors = report.server_errors + report.failed_jobs
    bad = errors + report.truncated_streams
    detail = (
        f"{report.cases} cases over {report.operations} operations and hostile uploads; statuses "
        f"{dict(sorted(report.statuses.items()))}; 5xx other than 503: {report.server_errors}, truncated "
        f"200 streams: {report.truncated_streams}; {len(report.jobs)} uploads accepted, "
        f"{report.failed_jobs} of them failed with a 5xx (or unfinished)"
        + (f"; e.g. {'; '.join(report.examples[:3])}" if report.examples else "")
        + (f"; no case generated for {', '.join(report.skipped)}" if report.skipped else "")
    )
    return Result("fuzz_5xx", errors, bad == 0, detail)


# -- soak_rss_growth ---------------------------------------------------------------------------


def soak(stack: FaultStack, d: Durations) -> Result:
    headers = stack.key("soak")
    ask = Unique("soak")
    url = stack.base + "/v1/query"

    def body(i: int) -> dict[str, Any]:
        return query_body(ask(i), allow_degraded=False)

    capacity = d.capacity
    if capacity is None:
        lone = sequential(url, n=4, body=lambda i: body(10_000 + i), headers=headers)
        if any(s.outcome != "full" for s in lone):
            return Result(
                "soak_rss_growth", None, False, f"lone requests not answered: {[s.status for s in lone]}"
            )
        latencies = [s.latency for s in lone]
        p50 = percentile(latencies, 50)
        # As bench/overload.py measures it: the highest rate whose P99 stays within 2× the lone P99.
        capacity, _ = find_capacity(
            url,
            headers,
            lambda i: body(20_000 + i),
            stack.settings,
            start=1.5 / p50,
            slo_s=2 * percentile(latencies, 99),
            step_s=10,
        )
        capacity = capacity or 1.0 / p50
    rate = capacity / 2
    warm = min(60.0, d.soak_s / 10)
    open_loop(
        url, rate=rate, duration_s=warm, body=lambda i: body(40_000 + i), headers=[headers], timeout_s=120
    )
    names = [n for n in stack.names() if n != "redis"]
    before = {n: stack.rss(n) for n in names}
    samples = open_loop(
        url,
        rate=rate,
        duration_s=d.soak_s,
        body=lambda i: body(100_000 + i),
        headers=[headers],
        timeout_s=120,
    )
    after = {n: stack.rss(n) for n in names}
    growth = {n: (after[n] - before[n]) / before[n] for n in names if before[n]}
    errors = Counter(s.outcome for s in samples if s.outcome != "full")
    worst = max(growth.values(), default=math.nan)
    ok = worst < 0.10 and not errors
    detail = (
        f"{rate:.2f} RAG req/s (half of {capacity:.2f}) for {d.soak_s:.0f} s: {len(samples)} sent, "
        f"not full {dict(errors)}; RSS growth "
        + ", ".join(f"{n} {g:+.1%} ({after[n] / MIB:.0f} MiB)" for n, g in growth.items())
    )
    return Result("soak_rss_growth", round(worst, 4), ok, detail)


SCENARIOS: dict[str, Callable[[FaultStack, Durations], Result]] = {
    "chunked_413": chunked_413,
    "cross_key_bytes": cross_key_bytes,
    "pool_exhaustion_success": pool_exhaustion,
    "redis_memory_levels_off": redis_memory,
    "redis_restart_lost_jobs": redis_restart,
    "worker_kill_stream_ok": worker_kill,
    "hostile_webhooks_p99_s": hostile_webhooks,
    "fuzz_5xx": fuzz,
    "soak_rss_growth": soak,
    "ingest_quadratic_p99_ratio": ingest_quadratic,
    "ingest_fair_jobs": ingest_fair,
}


def iter_selected(only: list[str] | None) -> Iterator[tuple[str, Callable[[FaultStack, Durations], Result]]]:
    for name, run in SCENARIOS.items():
        if not only or name in only:
            yield name, run
