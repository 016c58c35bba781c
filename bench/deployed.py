"""ragline as deployed: the stack `ragline up` starts, on one host, in one run.

    .venv/bin/python -m bench.deployed [--quick]

Every figure that describes ragline comes from here: `ragline up` runs as a user starts it (API,
retrieval, generation and callbacks workers, Flower) over the Python 3.11 docs (Debian's
python3.11-doc, ingested once and cached under --home), and is compared in the same run with the
bare vLLM engine in a process of its own (started after the stack stops) and with the stack under
the defaults ragline had before they were chosen from the host (bf16, no source budget, 32
sequences). Phases, one after another:

1. lone: one client asks questions in sequence (FAQ questions, each once, default top_k and
   deadline, streamed): first-token time, end-to-end time, tokens/s, how many came back
   degraded. The first ``--lone`` of them are the lone sample compared with the engine.
2. retrieval alone: its capacity (closed loop, retrieval-only cache misses), then its latency
   open-loop at a quarter of that capacity; generation alone with 4 RAG clients.
3. mixed: the same open-loop retrieval while the 4 RAG clients run: retrieval P99 against alone,
   and how much of each stage's solo speed the pair keeps; predicted against actual waits.
4. 8 and then 32 concurrent RAG clients: generated tokens/s.
5. the stack with the old defaults: the lone phase again.
6. the bare engine fed the prompts ragline built in phase 1 (rebuilt from the recorded sources by
   the worker's own prompt builder, as token ids padded to the engine's KV blocks), one at a
   time, same settings and sampling: once on every
   core this run may use, and once pinned to the cores ragline's engine process gets under its
   core split (the same CPU set, so the same thread count; on a host without a split, such as a
   GPU host, the two are one run). Against the first, the lone answer pays for the split too;
   against the second, only for ragline itself.

Prints a table, writes a PNG, and prints one JSON line last. Loopback only; every load is
bounded in count and time; SIGTERM or Ctrl-C stops whatever it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from ragline.broker.config.host import core_list
from ragline.broker.config.settings import Settings

from bench.env import share_models
from bench.openloop import open_loop, percentile
from bench.retrieval import DEFAULT_DOCS, ensure_index, faq_labels, load_queries
from ragline.processes import free_port, interrupt_on_signals

INDEX = "pydocs"
QUICK_INDEX = "pydocs-reference"
# The settings ragline used before they were chosen from the host: what the old-defaults arm runs.
OLD_DEFAULTS = {
    "RAGLINE_DTYPE": "bfloat16",
    "RAGLINE_MAX_NUM_SEQS": "32",
    "RAGLINE_MAX_SOURCE_TOKENS": "0",
    "RAGLINE_FREQUENCY_PENALTY": "0",
}
TARGETS = {
    "lone_gen_over_engine": (">=", 0.9),
    "lone_first_token_over_engine_ms": ("<=", 30.0),
    "lone_gen_over_engine_same_cores": (">=", 0.9),
    "lone_first_token_over_engine_same_cores_ms": ("<=", 50.0),
    "lone_e2e_ratio_vs_old_defaults": ("<=", 0.45),
    "mixed_retrieval_p99_ratio": ("<=", 3.0),
    "mixed_efficiency": (">=", 0.9),
    "gen_tok_s_32_over_8": (">=", 1.0),
    "lone_user_degraded": ("<=", 0),
    "predict_err_p90": ("<=", 0.5),
}


@dataclass
class RagSample:
    question: str
    status: int  # HTTP status; 0: no final event (timeout or broken stream)
    degraded: bool = False
    first_token_s: float = math.nan  # from sending to the first token event
    e2e_s: float = math.nan  # from sending to the final event
    completion_tokens: int = 0
    prompt_tokens: int = 0
    sources: list[dict[str, Any]] = field(default_factory=list)
    predicted_wait_s: float = math.nan  # the admission's prediction, when the answer reports it
    notice: str = ""  # why it was degraded, or the error's message
    finished_at: float = 0.0  # time.monotonic() of the final event


def ask(client: httpx.Client, base: str, headers: dict[str, str], question: str) -> RagSample:
    """One streamed RAG request, timed from the client's side."""
    sample = RagSample(question, 0)
    started = time.perf_counter()
    with client.stream("POST", base + "/v1/query/stream", json={"query": question}, headers=headers) as r:
        sample.status = r.status_code
        if r.status_code != 200:
            r.read()
            sample.e2e_s = time.perf_counter() - started
            sample.finished_at = time.monotonic()
            return sample
        event = ""
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                if event == "sources":
                    sample.sources = data["sources"]
                elif event == "token" and math.isnan(sample.first_token_s):
                    sample.first_token_s = time.perf_counter() - started
                elif event == "done":
                    sample.e2e_s = time.perf_counter() - started
                    sample.degraded = bool(data.get("degraded"))
                    sample.notice = data.get("notice") or ""
                    usage = data.get("usage") or {}
                    sample.completion_tokens = int(usage.get("completion_tokens", 0))
                    sample.prompt_tokens = int(usage.get("prompt_tokens", 0))
                    predicted = (data.get("timings") or {}).get("predicted_wait_ms")
                    if predicted is not None:
                        sample.predicted_wait_s = float(predicted) / 1000
                    break
                elif event == "error":
                    sample.status = int(data.get("status", 500))
                    sample.notice = str(data.get("message", ""))
                    break
    sample.finished_at = time.monotonic()
    if math.isnan(sample.e2e_s):
        sample.status = sample.status if sample.status != 200 else 0
    return sample


# Once every question has been asked, the next round asks them again in other words, so that
# none is a cache hit.
_ROUNDS = (
    "{}",
    "Please explain: {}",
    "Quick question: {}",
    "I would like to know: {}",
    "Help me understand: {}",
)


class Questions:
    """Distinct questions handed out once each, from any thread."""

    def __init__(self, questions: list[str]) -> None:
        self._questions = questions
        self._i = 0
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            round_, i = divmod(self._i, len(self._questions))
            if round_ >= len(_ROUNDS):
                raise SystemExit("ran out of distinct questions")
            self._i += 1
            return _ROUNDS[round_].format(self._questions[i])


@dataclass
class ClientsRun:
    samples: list[RagSample]
    wall_s: float
    # Clients were still waiting for an answer when the drain ended: their answers are left out.
    partial: bool = False

    @property
    def tok_s(self) -> float:
        return sum(s.completion_tokens for s in self.samples) / self.wall_s if self.wall_s > 0 else 0.0


def rag_clients(
    base: str,
    headers: dict[str, str],
    questions: Questions,
    n: int,
    duration_s: float,
    drain_s: float | None = None,
) -> ClientsRun:
    """n closed-loop clients, each asking a new question when its last answer is in, starting
    none after ``duration_s``; the wall time runs to the last answer.

    ``drain_s``: wait at most that long after ``duration_s`` for the answers in flight (None: for
    all of them); those still out are left out (``partial``), and their clients end when the API
    stops."""
    samples: list[RagSample] = []
    lock = threading.Lock()
    start = time.monotonic()
    read_s = 300.0 if drain_s is None else duration_s + drain_s

    def client_loop() -> None:
        with httpx.Client(timeout=httpx.Timeout(30.0, read=read_s)) as client:
            while time.monotonic() - start < duration_s:
                question = questions.next()
                try:
                    s = ask(client, base, headers, question)
                except httpx.HTTPError:
                    s = RagSample(question, -1, finished_at=time.monotonic())
                with lock:
                    samples.append(s)

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if drain_s is None else max(0.0, start + duration_s + drain_s - time.monotonic()))
    with lock:
        done = list(samples)
    end = max((s.finished_at for s in done), default=start)
    return ClientsRun(done, end - start, partial=any(t.is_alive() for t in threads))


def _clients_job(
    base: str, headers: dict[str, str], questions: list[str], n: int, duration_s: float
) -> ClientsRun:
    return rag_clients(base, headers, Questions(questions), n, duration_s)


def rag_clients_apart(
    base: str, headers: dict[str, str], questions: Questions, n: int, duration_s: float
) -> Future[ClientsRun]:
    """:func:`rag_clients` in a process of its own: threads parsing token streams in this process
    would delay the retrieval client beside them and be counted as the server's latency."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    # More than n clients can ask in the time (an answer takes well over a second here).
    batch = [questions.next() for _ in range(n * (int(duration_s) + 2))]
    future = pool.submit(_clients_job, base, headers, batch, n, duration_s)
    pool.shutdown(wait=False)
    return future


def lone(base: str, headers: dict[str, str], questions: list[str]) -> list[RagSample]:
    with httpx.Client(timeout=300) as client:
        samples = [ask(client, base, headers, q) for q in questions]
    full = [s for s in samples if s.status == 200 and not s.degraded]
    print(
        f"  {len(full)} of {len(samples)} full answers, end-to-end P50 {p50([s.e2e_s for s in full]):.1f} s"
    )
    for s in samples:
        if s not in full:
            print(f"  not full: {s.status} {s.notice[:160]}")
    return samples


def retrieval_capacity(base: str, headers: dict[str, str], questions: Questions, duration_s: float) -> float:
    """Retrieval-only cache misses per second, 32 closed-loop clients."""
    import asyncio

    async def run() -> int:
        done = 0
        stop = time.monotonic() + duration_s
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:

            async def one() -> None:
                nonlocal done
                while time.monotonic() < stop:
                    body = {"query": questions.next(), "mode": "retrieval"}
                    r = await client.post(base + "/v1/query", json=body, headers=headers)
                    done += r.status_code == 200

            await asyncio.gather(*(one() for _ in range(32)))
        return done

    started = time.monotonic()
    done = asyncio.run(run())
    return done / (time.monotonic() - started)


def retrieval_open_loop(
    base: str, headers: dict[str, str], questions: Questions, rate: float, duration_s: float
) -> tuple[list[float], float]:
    """Latencies (s) of retrieval-only cache misses sent at ``rate``, and the rate answered."""
    n = max(1, round(rate * duration_s))
    batch = [questions.next() for _ in range(n)]
    samples = open_loop(
        base + "/v1/query",
        rate=rate,
        duration_s=duration_s,
        body=lambda i: {"query": batch[i], "mode": "retrieval"},
        headers=[headers],
    )
    ok = [s.latency for s in samples if s.status == 200]
    span = max((s.sent + s.latency for s in samples), default=duration_s)
    return ok, len(ok) / max(span, duration_s)


def flush_result_cache(redis_url: str, prefix: str = "ragline") -> None:
    """Forget cached answers so that every phase measures misses."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:qc*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])


# -- the stack and the engine, each in processes of their own ----------------------------------


@dataclass
class Up:
    """`ragline up` in its own session, its output in a log file."""

    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    def stop(self, grace_s: float = 30.0) -> float:
        """SIGTERM, as a container runtime sends it; returns how long the stack took to exit."""
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace_s)
        took = time.monotonic() - started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return took


def start_up(env: dict[str, str], log: Path, api_port: int, timeout_s: float = 900) -> Up:
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragline", "up"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    up = Up(proc, f"http://127.0.0.1:{api_port}", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ragline up exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(up.base + "/readyz", timeout=2).status_code == 200:
                return up
        time.sleep(1)
    up.stop()
    raise TimeoutError(f"ragline up was not ready in {timeout_s:.0f} s; see {log}")


def engine_only(prompts_file: Path, result_file: Path) -> None:
    """In a process of its own: the bare engine, the prompts one at a time (TTFT, e2e, tokens)."""
    from ragline.broker.config.settings import get_settings
    from ragline.broker.contract.messages import SOURCES
    from ragline.workers.generation.engine import EngineHost
    from ragline.workers.generation.model_prep import generation_model_path
    from ragline.workers.generation.prompt import PromptBuilder, build_rag_prompt
    from transformers import AutoTokenizer

    settings = get_settings()
    host = EngineHost(settings.generation, generation_model_path(settings))
    host.start()
    # Built here, padded to this engine's KV blocks, as the worker builds them.
    tokenizer = AutoTokenizer.from_pretrained(generation_model_path(settings))
    builder = PromptBuilder(tokenizer, block_tokens=host.prefix_block_tokens())
    prompts = [
        build_rag_prompt(
            settings.generation, builder, r["question"], SOURCES.validate_python(r["sources"])
        ).token_ids
        for r in json.loads(prompts_file.read_text())
    ]
    rows = []
    try:
        for i, prompt in enumerate(prompts):
            started = time.perf_counter()
            first, tokens = math.nan, 0
            for delta in host.stream(
                f"bare-{i}",
                prompt,
                max_tokens=settings.generation.max_new_tokens,
                timeout_s=settings.generation.generation_timeout_s,
            ):
                if delta.text and math.isnan(first):
                    first = time.perf_counter() - started
                tokens = delta.completion_tokens
            rows.append({"first_token_s": first, "e2e_s": time.perf_counter() - started, "tokens": tokens})
    finally:
        host.shutdown()
    result_file.write_text(json.dumps(rows))


def engine_cores(env: dict[str, str]) -> tuple[int, ...] | None:
    """The cores `ragline up` started with ``env`` gives its engine process (None: every core,
    as on a GPU host, a one-core host or with RAGLINE_SPLIT_CORES=false)."""
    from ragline.stack import core_split

    split = core_split(_settings_from(env))
    return split.engine if split is not None else None


def start_pinned(
    cmd: list[str], env: dict[str, str], cores: tuple[int, ...] | None
) -> subprocess.Popen[bytes]:
    """``cmd`` in a session of its own, on ``cores`` only (None: this process's), as the
    supervisor of `ragline up` confines its children: a pinned engine sizes its threads from them."""

    def pin() -> None:
        if cores is not None:
            os.sched_setaffinity(0, cores)

    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=pin)


def bare_engine(
    prompts_file: Path, result_file: Path, env: dict[str, str], cores: tuple[int, ...] | None
) -> list[dict[str, float]]:
    """The bare engine's run (:func:`engine_only`) in a process of its own, on ``cores``."""
    cmd = [sys.executable, "-m", "bench.deployed", "--engine-only", str(prompts_file), str(result_file)]
    bare = start_pinned(cmd, env, cores)
    try:
        if bare.wait(1800) != 0:
            raise RuntimeError(f"the bare engine run failed ({bare.returncode})")
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(bare.pid, signal.SIGKILL)  # its engine core too
    rows: list[dict[str, float]] = json.loads(result_file.read_text())
    return rows


def engine_tok_s(rows: list[dict[str, float]]) -> float:
    return sum(r["tokens"] for r in rows) / (sum(r["e2e_s"] for r in rows) or math.nan)


def against_engine(
    samples: list[RagSample], rows: list[dict[str, float]], suffix: str = ""
) -> dict[str, float]:
    """The lone answers against the bare engine's run on the same prompts: tokens/s as a ratio,
    the median first token's lead in ms (``suffix`` names which engine run)."""
    return {
        f"lone_gen_over_engine{suffix}": ratio(tok_s(samples), engine_tok_s(rows)),
        f"lone_first_token_over_engine{suffix}_ms": 1000
        * (p50([s.first_token_s for s in samples]) - p50([r["first_token_s"] for r in rows])),
    }


def recorded_requests(samples: list[RagSample]) -> list[dict[str, Any]]:
    """Each request's question and recorded sources: the bare engine's process rebuilds the
    prompts ragline's worker built from them."""
    return [{"question": s.question, "sources": s.sources} for s in samples]


def _settings_from(env: dict[str, str]) -> Settings:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -- figures ----------------------------------------------------------------------------------


def p50(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def tok_s(samples: list[RagSample]) -> float:
    tokens = sum(s.completion_tokens for s in samples)
    seconds = sum(s.e2e_s for s in samples if not math.isnan(s.e2e_s))
    return tokens / seconds if seconds else math.nan


def prediction_errors(samples: list[RagSample]) -> list[float]:
    """|predicted - actual| / actual for admitted, answered requests that report a prediction."""
    return [
        abs(s.predicted_wait_s - s.e2e_s) / s.e2e_s
        for s in samples
        if s.status == 200 and not s.degraded and not math.isnan(s.predicted_wait_s) and s.e2e_s > 0
    ]


def held(name: str, value: float) -> str:
    op, target = TARGETS[name]
    if math.isnan(value):
        return "n/a"
    return "yes" if (value >= target if op == ">=" else value <= target) else "**no**"


def plot(
    figures: dict[str, Any], lone_rows: dict[str, list[float]], mixed: dict[str, list[float]], out: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lone, ax_mixed) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(lone_rows)
    ax_lone.boxplot([lone_rows[n] for n in names], tick_labels=names)
    ax_lone.set(ylabel="seconds", title="lone RAG request, end to end")
    for name, values in mixed.items():
        ordered = sorted(v * 1000 for v in values)
        if ordered:
            ax_mixed.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    ax_mixed.set(
        xscale="log", xlabel="retrieval latency, ms", ylabel="fraction", title="retrieval at 1/4 capacity"
    )
    ax_mixed.legend()
    fig.suptitle(f"bench/deployed.py, {figures['machine']}")
    fig.tight_layout()
    path = out / "deployed.png"
    fig.savefig(path, dpi=110)
    return path


def machine() -> str:
    from ragline.broker.config import host

    here = host.detect()
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    bf16 = "native bf16" if here.native_bf16 else "no native bf16"
    return f"{model or 'CPU'}, {len(here.cores)} cores, {here.memory_gib:.0f} GiB, {bf16}"


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    lone: int  # lone requests compared with the engine
    lone_user: int  # questions one user asks in sequence (degraded count)
    phase_s: float  # each closed-loop or open-loop phase
    mixed_s: float
    capacity_s: float


FULL = Plan(lone=20, lone_user=35, phase_s=30, mixed_s=60, capacity_s=10)
QUICK = Plan(lone=4, lone_user=6, phase_s=10, mixed_s=15, capacity_s=5)


def stack_env(args: argparse.Namespace, index: str, **extra: str) -> tuple[dict[str, str], int]:
    api_port = free_port()
    env = dict(os.environ)
    env.update(
        RAGLINE_HOME=str(args.home),
        RAGLINE_REDIS_URL=args.redis_url,
        RAGLINE_DEFAULT_INDEX=index,
        RAGLINE_API_PORT=str(api_port),
        RAGLINE_FLOWER_PORT=str(free_port()),
        RAGLINE_KEY_RATE_PER_S="100000",
        RAGLINE_KEY_BURST="100000",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    if args.eager:
        env["RAGLINE_ENFORCE_EAGER"] = "true"
    env.update(extra)
    return env, api_port


def api_key(redis_url: str) -> dict[str, str]:
    import redis
    from ragline.broker.redis.keys import Keys
    from ragline.broker.state import apikeys

    key, _ = apikeys.create(
        redis.Redis.from_url(redis_url), Keys(), "bench-deployed", rate=1e6, burst=1_000_000
    )
    return {"Authorization": f"Bearer {key}"}


def run(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    docs = args.docs / "reference" if args.quick else args.docs
    index = QUICK_INDEX if args.quick else INDEX
    if not docs.exists():
        raise SystemExit(f"{docs} not found: apt-get install python3.11-doc")
    share_models(args.home)
    # A clean database: no admission history, jobs or tasks left by an earlier run (the index
    # is registered again from disk below).
    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    base_settings = Settings().replace(home=args.home, redis_url=args.redis_url, default_index=index)
    from ragline.workers.generation.model_prep import prepare_default_model

    prepare_default_model(base_settings)
    ensure_index(base_settings.replace(default_index=index), docs, index=index)
    faq = [q for q, _, _ in faq_labels(args.docs)]
    load = Questions(load_queries(base_settings, index=index))
    headers = api_key(args.redis_url)
    logs = args.out / "deployed-logs"
    logs.mkdir(parents=True, exist_ok=True)
    f: dict[str, Any] = {"machine": machine()}
    print(f"machine: {f['machine']}; {len(faq)} FAQ questions", flush=True)

    env, port = stack_env(args, index)
    print("starting ragline up (host defaults)", flush=True)
    up = start_up(env, logs / "up-new.log", port)
    try:
        flush_result_cache(args.redis_url)
        print(f"phase 1: one user, {plan.lone_user} questions in sequence", flush=True)
        lone_new = lone(up.base, headers, faq[: plan.lone_user])
        lone_sample = [s for s in lone_new[: plan.lone] if s.status == 200 and not s.degraded]
        print("phase 2: retrieval capacity, then retrieval and generation alone", flush=True)
        capacity = retrieval_capacity(up.base, headers, load, plan.capacity_s)
        rate = capacity / 4
        alone_lat, _ = retrieval_open_loop(up.base, headers, load, rate, plan.phase_s)
        rag_q = Questions(faq[plan.lone_user :] + load_queries(base_settings, index=index, seed=1))
        gen_alone = rag_clients_apart(up.base, headers, rag_q, 4, plan.phase_s).result()
        print("phase 3: mixed", flush=True)
        mixed = rag_clients_apart(up.base, headers, rag_q, 4, plan.mixed_s)
        time.sleep(2)  # the clients' process starts and their first requests are in
        mixed_lat, mixed_rate = retrieval_open_loop(up.base, headers, load, rate, plan.mixed_s)
        gen_mixed = mixed.result()
        print("phase 4: 8 and 32 RAG clients", flush=True)
        gen_8 = rag_clients_apart(up.base, headers, rag_q, 8, plan.phase_s).result()
        gen_32 = rag_clients_apart(up.base, headers, rag_q, 32, plan.phase_s).result()
    finally:
        f["stop_s"] = up.stop()
    print(f"ragline up stopped in {f['stop_s']:.1f} s", flush=True)

    old_env, old_port = stack_env(args, index, **OLD_DEFAULTS)
    print("phase 5: ragline up with the old defaults", flush=True)
    up_old = start_up(old_env, logs / "up-old.log", old_port)
    try:
        flush_result_cache(args.redis_url)
        lone_old = lone(up_old.base, headers, faq[: plan.lone])
    finally:
        up_old.stop()

    print("phase 6: the bare engine on ragline's prompts, on every core", flush=True)
    prompts_file = logs / "prompts.json"
    prompts_file.write_text(json.dumps(recorded_requests(lone_sample)))
    engine = bare_engine(prompts_file, logs / "engine.json", env, None)
    cores = engine_cores(env)
    if cores is None:
        print("  no core split on this host: the same cores are every core", flush=True)
        engine_same = engine
    else:
        print(f"  again on ragline's engine cores ({core_list(cores)})", flush=True)
        engine_same = bare_engine(prompts_file, logs / "engine-same-cores.json", env, cores)
    f["engine_same_cores"] = core_list(cores) if cores is not None else "all"
    f |= against_engine(lone_sample, engine)
    f |= against_engine(lone_sample, engine_same, "_same_cores")
    f["lone_e2e_s_p50"] = p50([s.e2e_s for s in lone_sample])
    f["lone_e2e_ratio_vs_old_defaults"] = ratio(
        f["lone_e2e_s_p50"], p50([s.e2e_s for s in lone_old if s.status == 200 and not s.degraded])
    )
    f["mixed_retrieval_p99_ratio"] = ratio(percentile(mixed_lat, 99), percentile(alone_lat, 99))
    f["mixed_efficiency"] = ratio(mixed_rate, capacity) + ratio(gen_mixed.tok_s, gen_alone.tok_s)
    f["gen_tok_s_32_over_8"] = ratio(gen_32.tok_s, gen_8.tok_s)
    f["lone_user_degraded"] = sum(s.degraded or s.status != 200 for s in lone_new)
    errors = prediction_errors(gen_mixed.samples)
    f["predict_err_p50"] = percentile(errors, 50)
    f["predict_err_p90"] = percentile(errors, 90)
    details = {
        "engine_tok_s": engine_tok_s(engine),
        "engine_tok_s_same_cores": engine_tok_s(engine_same),
        "ragline_lone_tok_s": tok_s(lone_sample),
        "lone_e2e_s_p50_old": p50([s.e2e_s for s in lone_old]),
        "lone_prompt_tokens_p50": p50([float(s.prompt_tokens) for s in lone_sample]),
        "retrieval_capacity": capacity,
        "retrieval_p99_ms_alone": 1000 * percentile(alone_lat, 99),
        "retrieval_p99_ms_mixed": 1000 * percentile(mixed_lat, 99),
        "gen_tok_s_alone_4": gen_alone.tok_s,
        "gen_tok_s_mixed_4": gen_mixed.tok_s,
        "gen_tok_s_8": gen_8.tok_s,
        "gen_tok_s_32": gen_32.tok_s,
        "degraded_32": sum(s.degraded for s in gen_32.samples),
    }
    (args.out / "deployed.json").write_text(
        json.dumps(
            {"figures": f, "details": details, "lone": [asdict(s) | {"sources": []} for s in lone_new]}
        )
    )
    png = plot(
        f,
        {
            "ragline": [s.e2e_s for s in lone_sample],
            "old defaults": [s.e2e_s for s in lone_old if not math.isnan(s.e2e_s)],
            "bare engine": [r["e2e_s"] for r in engine],
            "bare engine, same cores": [r["e2e_s"] for r in engine_same],
        },
        {"alone": alone_lat, "beside 4 RAG clients": mixed_lat},
        args.out,
    )
    print(f"\nmachine: {f['machine']}")
    print("\n| figure | value | target | held |\n|---|---|---|---|")
    for name, (op, target) in TARGETS.items():
        print(f"| {name} | {f[name]:.3f} | {op} {target} | {held(name, f[name])} |")
    for name in ("lone_e2e_s_p50", "predict_err_p50", "stop_s"):
        print(f"| {name} | {f[name]:.3f} | | |")
    print("\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in details.items()))
    print(f"\nplot: {png}")
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in f.items()}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="a smoke run: the reference docs, short phases")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile (starts faster)")
    parser.add_argument(
        "--engine-only", nargs=2, type=Path, metavar=("PROMPTS", "RESULT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, through the finally blocks that stop what this run started.
    interrupt_on_signals()
    if args.engine_only:
        engine_only(*args.engine_only)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
