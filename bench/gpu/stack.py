"""bench/gpu/run.py's measurements of ragline itself: Redis (an embedded one unless a URL is given),
a real ``ragline worker generation`` on the accelerator, a retrieval worker and the API on the
CPU, all started by the benchmark's Supervisor and stopped with it.

- the generation worker through Celery alone: tasks sent as the retrieval worker sends them,
  tokens read back from each request's Redis Stream, at the plan's concurrency points;
- lone requests through the whole stack (API, retrieval, generation): first token at the client;
- closed-loop clients through the whole stack: admission's predicted wait against the actual one.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from ragline.broker.config.settings import Settings

from bench.deployed import Questions, RagSample, api_key, rag_clients
from bench.env import settings_env
from bench.generation import FAQ_INDEX, Lone, _wait_live, lone_requests
from bench.gpu.engines import RAGLINE, Outcome, Row, closed_loop, requests_at
from bench.gpu.inputs import RagRequest
from ragline import processes
from ragline.processes import Child, Supervisor


class PhaseOverrun(TimeoutError):
    """The phase reached its deadline before this step could finish."""


@dataclass
class StackResult:
    rows: list[Row] = field(default_factory=list)
    lone: Lone = field(default_factory=Lone)
    load: list[RagSample] = field(default_factory=list)
    load_clients: int = 0
    load_partial: bool = False
    # Libraries the API process mapped that it must never load (torch, faiss, vllm): none.
    api_heavy: list[str] = field(default_factory=list)
    failed: str = ""  # why the phase stopped early, if it did


def _left(deadline: float) -> float:
    left = deadline - time.time()
    if left <= 0:
        raise PhaseOverrun("the stack phase reached its deadline")
    return left


def _start(sup: Supervisor, name: str, cmd: list[str], env: dict[str, str], logs: Path, **kw: Any) -> Child:
    """``cmd`` as the Supervisor's child ``name``, its output appended to ``logs/name.log``."""
    with (logs / f"{name}.log").open("ab") as log:
        return sup.start(name, cmd, env, stdout=log, **kw)


def _start_redis(sup: Supervisor, settings: Settings, logs: Path, deadline: float) -> str:
    port = processes.free_port()
    _start(
        sup,
        "redis",
        processes.embedded_redis_command(settings.home, port),
        settings_env(settings),
        logs,
        last=True,  # stopped after the workers, which write to it while they drain
    )
    url = f"redis://127.0.0.1:{port}/0"
    while not processes.redis_answers(url):
        _left(deadline)
        if (dead := sup.exited()) is not None:
            raise RuntimeError(f"{dead.name} exited ({dead.proc.returncode}); see {logs}")
        time.sleep(0.1)
    return url


def _wait_ready(base: str, sup: Supervisor, deadline: float) -> None:
    while True:
        _left(deadline)
        if (dead := sup.exited()) is not None:
            raise RuntimeError(f"{dead.name} exited ({dead.proc.returncode})")
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def start_stack(
    sup: Supervisor, settings: Settings, docs: Path, logs: Path, deadline: float, *, redis_url: str = ""
) -> tuple[Settings, str]:
    """Redis (an embedded one unless ``redis_url``, whose database is emptied first), the
    generation worker (its engine starts while the FAQ is ingested), the index, the retrieval
    worker and the API; returns the settings as the children see them and the API's base URL
    once every part is ready."""
    if redis_url:
        import redis

        # No index, job or admission history of an earlier run.
        redis.Redis.from_url(redis_url, socket_timeout=5).flushdb()
    settings = settings.replace(redis_url=redis_url or _start_redis(sup, settings, logs, deadline))
    settings = settings.replace(api_port=processes.free_port())
    ragline = [sys.executable, "-m", "ragline"]
    _start(sup, "generation", [*ragline, "worker", "generation"], settings_env(settings), logs)
    # Retrieval and the API stay on the CPU, as deployed: no process but the generation worker
    # may take accelerator memory from the engine.
    cpu_env = settings_env(settings, CUDA_VISIBLE_DEVICES="")
    ingest = _start(
        sup, "ingest", [*ragline, "ingest", str(docs / "faq"), "--index", FAQ_INDEX], cpu_env, logs
    )
    while ingest.proc.poll() is None:
        _left(deadline)
        time.sleep(0.2)
    sup.stop("ingest")
    if ingest.proc.returncode != 0:
        raise RuntimeError(f"ragline ingest failed ({ingest.proc.returncode}); see {logs / 'ingest.log'}")
    _start(sup, "retrieval", [*ragline, "worker", "retrieval"], cpu_env, logs)
    _start(sup, "api", [*ragline, "api"], cpu_env, logs)
    for queue in ("retrieval", "generation"):
        _wait_live(settings, queue, sup, timeout=_left(deadline))
    base = f"http://127.0.0.1:{settings.api.api_port}"
    _wait_ready(base, sup, deadline)
    return settings, base


_HEAVY = ("/torch/", "/faiss/", "/vllm/")


def heavy_libraries(pid: int) -> list[str]:
    """The files of torch, faiss or vLLM that process ``pid`` has mapped."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if any(h in p for h in _HEAVY))


# -- the generation worker through Celery ------------------------------------------------------


async def worker_points(
    settings: Settings, requests: list[RagRequest], plan: dict[str, Any], deadline: float
) -> list[Row]:
    """The worker's tokens/s at each point, as bench/gpu/engines.py measures the bare engine; what a
    point leaves in flight at its cap is cancelled (the worker stops generating it)."""
    from ragline.broker.celery_app import create_celery
    from ragline.broker.contract.messages import Done, Error, GenerateTask
    from ragline.broker.contract.queues import GENERATE_TASK, GENERATION_QUEUE
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import async_client
    from ragline.broker.streams.cancel import arequest_cancel
    from ragline.broker.streams.events import read_events

    app = create_celery(settings.redis)
    client = async_client(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    in_flight: set[str] = set()

    async def one(i: int) -> Outcome:
        r = requests[i % len(requests)]
        rid = uuid.uuid4().hex
        in_flight.add(rid)
        begun = time.perf_counter()
        task = GenerateTask(
            request_id=rid, query=r.question, sources=list(r.sources), enqueued_at=time.time()
        )
        await asyncio.to_thread(app.send_task, GENERATE_TASK, kwargs=task.encode(), queue=GENERATION_QUEUE)
        first, tokens = math.nan, 0
        async for event in read_events(client, keys, rid, timeout_s=settings.generation.generation_timeout_s):
            if event.type == "token" and math.isnan(first):
                first = time.perf_counter() - begun
            if isinstance(event.payload, Done) and event.payload.usage is not None:
                tokens = event.payload.usage.completion_tokens
            if isinstance(event.payload, Error):
                raise RuntimeError(f"{event.payload.status}: {event.payload.message}")
        in_flight.discard(rid)
        return Outcome(tokens, first, time.perf_counter() - begun)

    async def cancel_left() -> None:
        for rid in list(in_flight):
            await arequest_cancel(client, keys, rid, ttl_s=settings.jobs.cancel_ttl_s)
        in_flight.clear()

    rows = []
    try:
        await closed_loop(one, c=plan["warmup"], n=plan["warmup"], cap_s=min(60, _left(deadline)))
        await cancel_left()
        for c in plan["points"]:
            cap = min(float(plan["point_cap_s"][str(c)]), _left(deadline))
            n = requests_at(c, prompts=len(requests), least=plan["least_requests"])
            done = await closed_loop(one, c=c, n=n, cap_s=cap)
            await cancel_left()
            if done.first_error:
                print(f"  {done.errors} failed at {c}: {done.first_error}", flush=True)
            rows.append(
                Row.of(RAGLINE, c, done.outcomes, done.wall_s, errors=done.errors, partial=done.partial)
            )
            r = rows[-1]
            print(f"  {r.engine} at {c}: {r.tok_s:.1f} tok/s{' (partial)' if r.partial else ''}", flush=True)
    finally:
        await client.aclose()
    return rows


def stack_phase(
    sup: Supervisor,
    settings: Settings,
    requests: list[RagRequest],
    plan: dict[str, Any],
    docs: Path,
    logs: Path,
    deadline: float,
    *,
    redis_url: str = "",
) -> StackResult:
    """Every part of the stack measured in turn; a step that overruns the phase's deadline ends
    the phase with what was measured before it (``failed`` says which)."""
    from bench.retrieval import load_queries

    result = StackResult()
    try:
        started = time.perf_counter()
        settings, base = start_stack(sup, settings, docs, logs, deadline, redis_url=redis_url)
        print(f"  stack ready in {time.perf_counter() - started:.0f} s", flush=True)
        result.api_heavy = heavy_libraries(next(c.proc.pid for c in sup.children if c.name == "api"))
        result.rows = asyncio.run(worker_points(settings, requests, plan, deadline))
        questions = [r.question for r in requests]
        result.lone = lone_requests(settings, base, questions, n=plan["lone"], until=deadline)
        headers = api_key(settings.redis.redis_url)
        load = Questions([*questions, *load_queries(settings, index=FAQ_INDEX)])
        drain = float(plan["load_drain_s"])
        duration = min(float(plan["load_s"]), _left(deadline) - drain)
        if duration <= 0:
            raise PhaseOverrun("no time left for the clients' load")
        result.load_clients = plan["load_clients"]
        clients = rag_clients(base, headers, load, plan["load_clients"], duration, drain)
        result.load, result.load_partial = clients.samples, clients.partial
    except Exception as exc:
        # The run reports what was measured before; the figures this phase owes stay missing.
        result.failed = f"{type(exc).__name__}: {exc}"
        print(f"  stack phase stopped: {result.failed}", flush=True)
        if not isinstance(exc, PhaseOverrun | TimeoutError):
            traceback.print_exc()
    return result
