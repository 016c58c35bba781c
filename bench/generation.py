"""Generation under load: transformers vs vLLM vs ragline's worker, same model and prompts, one run.

    .venv/bin/python -m bench.generation [--eager] [--max-tokens 64]

SmolLM2-135M-Instruct in the dtype the host chooses (broker/config/host.py); RAG prompts built from the
Python 3.11 FAQ (Debian's python3.11-doc): each FAQ question with its own answer section and two
neighbours as sources.
Measured at 1, 8 and 32 concurrent requests: output tokens/s, TTFT and end-to-end P50/P99.
- transformers one at a time: each prompt timed alone; c requests arriving together are served
  in turn, so the k-th waits for the k-1 before it (TTFT = end-to-end: no streaming);
- transformers with bucketed static batches (workers/generation/hf_engine.py);
- the vLLM engine alone, in this process;
- ragline's generation worker: Celery tasks on the `generation` queue, tokens read back from
  each request's Redis Stream;
then a lone full RAG request through the API 30 times (cache miss: retrieval, both queues,
generation): time to the first `token` event. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Source

from bench.env import settings_env, share_models
from ragline.processes import Supervisor, free_port, interrupt_on_signals

CONCURRENCY = (1, 8, 32)
DOCS = Path("/usr/share/doc/python3.11/html/_sources")
FAQ_INDEX = "pyfaq"


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(name: str, c: int, tokens: int, wall_s: float, ttft: list[float], e2e: list[float]) -> dict:
    return {
        "engine": name,
        "concurrency": c,
        "tok_s": tokens / wall_s,
        "ttft_p50_ms": pct(ttft, 50) * 1000,
        "ttft_p99_ms": pct(ttft, 99) * 1000,
        "e2e_p50_ms": pct(e2e, 50) * 1000,
        "e2e_p99_ms": pct(e2e, 99) * 1000,
    }


def faq_requests(n: int) -> list[tuple[str, list[Source]]]:
    from ragline.workers.retrieval.readers import read_sections

    sections = []
    for file in sorted((DOCS / "faq").glob("*.rst.txt")):
        sections += [(s, str(file)) for s in read_sections(file)]
    out = []
    for i, (section, path) in enumerate(sections):
        if not section.title.endswith("?"):
            continue
        neighbours = [sections[(i + d) % len(sections)] for d in (1, 2)]
        sources = [
            Source(
                chunk_id=f"{path}:{j}",
                title=s.title,
                text=" ".join(s.text.split()[:150]),
                source=p,
                score=0.9 - j / 10,
            )
            for j, (s, p) in enumerate([(section, path), *neighbours])
        ]
        out.append((section.title, sources))
    return out[:n]


def build_prompts(
    settings: Settings, requests: list[tuple[str, list[Source]]], *, block_tokens: int = 1
) -> list[tuple[int, ...]]:
    """The worker's prompts (token ids), padded to an engine's KV blocks as the worker pads them."""
    from ragline.workers.generation.model_prep import generation_model_path
    from ragline.workers.generation.prompt import PromptBuilder, build_rag_prompt
    from transformers import AutoTokenizer

    builder = PromptBuilder(
        AutoTokenizer.from_pretrained(generation_model_path(settings)), block_tokens=block_tokens
    )
    return [build_rag_prompt(settings.generation, builder, q, s).token_ids for q, s in requests]


def run_threads(
    stream_fn, prompts: list[tuple[int, ...]], c: int, max_tokens: int
) -> tuple[int, float, list, list]:
    """c requests at a time from c threads; returns (tokens, wall seconds, TTFTs, end-to-ends)."""
    ttft: list[float] = []
    e2e: list[float] = []
    tokens = 0
    lock = threading.Lock()
    work = list(enumerate(prompts))

    def worker() -> None:
        nonlocal tokens
        while True:
            with lock:
                if not work:
                    return
                i, prompt = work.pop(0)
            started = time.perf_counter()
            first = None
            n = 0
            for delta in stream_fn(
                f"b{i}-{uuid.uuid4().hex[:6]}", prompt, max_tokens=max_tokens, timeout_s=600
            ):
                if delta.text and first is None:
                    first = time.perf_counter() - started
                n = delta.completion_tokens
            with lock:
                tokens += n
                ttft.append(first if first is not None else time.perf_counter() - started)
                e2e.append(time.perf_counter() - started)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens, time.perf_counter() - started, ttft, e2e


def bench_transformers(settings: Settings, prompts: list[tuple[int, ...]], max_tokens: int) -> list[dict]:
    from ragline.workers.generation.hf_engine import TransformersEngine
    from ragline.workers.generation.model_prep import generation_model_path

    engine = TransformersEngine(settings.generation, generation_model_path(settings))
    engine.start()
    rows = []
    # One at a time: each prompt timed alone (batch of one).
    durations, counts = [], []
    for prompt in prompts[:16]:
        started = time.perf_counter()
        [(_, n)] = engine.generate_batch([list(prompt)], [max_tokens])
        durations.append(time.perf_counter() - started)
        counts.append(n)
    for c in CONCURRENCY:
        # c requests arrive together and are served in turn: the k-th ends after the first k
        # (measured durations, reused in order when c exceeds the prompts timed).
        served = [durations[k % len(durations)] for k in range(c)]
        ends = list(np.cumsum(served))
        tokens = sum(counts[k % len(counts)] for k in range(c))
        rows.append(summarize("transformers sequential", c, tokens, ends[-1], ends, ends))
    print(rows[-1], flush=True)
    for c in (8, 32):
        tokens, wall, ttft, e2e = run_threads(engine.stream, prompts[:32], c, max_tokens)
        rows.append(summarize("transformers bucketed", c, tokens, wall, ttft, e2e))
        print(rows[-1], flush=True)
    engine.shutdown()
    return rows


def bench_vllm(settings: Settings, requests: list[tuple[str, list[Source]]], max_tokens: int) -> list[dict]:
    from ragline.workers.generation.engine import EngineHost
    from ragline.workers.generation.model_prep import generation_model_path

    engine = EngineHost(settings.generation, generation_model_path(settings))
    started = time.perf_counter()
    engine.start()
    print(f"vLLM engine started in {time.perf_counter() - started:.0f}s", flush=True)
    prompts = build_prompts(settings, requests, block_tokens=engine.prefix_block_tokens())
    run_threads(engine.stream, prompts[:4], 4, 8)  # warm up
    rows = []
    for c in CONCURRENCY:
        tokens, wall, ttft, e2e = run_threads(engine.stream, prompts[: max(8, c)], c, max_tokens)
        rows.append(summarize("vLLM engine alone", c, tokens, wall, ttft, e2e))
        print(rows[-1], flush=True)
    engine.shutdown()
    return rows


async def _via_worker(settings: Settings, requests: list[tuple[str, list[Source]]], c: int) -> tuple:
    from ragline.broker.celery_app import create_celery
    from ragline.broker.contract.messages import Done, GenerateTask
    from ragline.broker.contract.queues import GENERATE_TASK, GENERATION_QUEUE
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import async_client
    from ragline.broker.streams.events import read_events

    app = create_celery(settings.redis)
    client = async_client(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    sem = asyncio.Semaphore(c)
    ttft, e2e, tokens = [], [], 0

    async def one(query: str, sources: list[Source]) -> None:
        nonlocal tokens
        async with sem:
            rid = uuid.uuid4().hex
            started = time.perf_counter()
            task = GenerateTask(request_id=rid, query=query, sources=sources, enqueued_at=time.time())
            await asyncio.to_thread(
                app.send_task, GENERATE_TASK, kwargs=task.encode(), queue=GENERATION_QUEUE
            )
            first = None
            async for event in read_events(client, keys, rid, timeout_s=600):
                if event.type == "token" and first is None:
                    first = time.perf_counter() - started
                if isinstance(event.payload, Done) and event.payload.usage is not None:
                    tokens += event.payload.usage.completion_tokens
            ttft.append(first or time.perf_counter() - started)
            e2e.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(q, s) for q, s in requests))
    wall = time.perf_counter() - started
    await client.aclose()
    return tokens, wall, ttft, e2e


def _wait_live(settings: Settings, queue: str, sup: Supervisor, timeout: float = 600) -> None:
    import redis
    from ragline.broker.redis.keys import Keys

    client = redis.Redis.from_url(settings.redis.redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (dead := sup.exited()) is not None:
            raise RuntimeError(f"{dead.name} exited ({dead.proc.returncode})")
        if client.zcount(
            Keys(settings.redis.key_prefix).workers(queue),
            time.time() - settings.redis.worker_heartbeat_ttl_s,
            "+inf",
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(queue)


@dataclass
class Lone:
    """Lone full RAG requests: first token at the client, and what the worker reported."""

    first_s: list[float] = field(default_factory=list)  # request sent -> first token event read
    engine_first_ms: list[float] = field(default_factory=list)  # worker: engine start -> first token
    prompt_tokens: list[int] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)  # worker-reported: both queues' waits
    retrieval_ms: list[float] = field(default_factory=list)  # worker-reported: embed and search


def lone_requests(
    settings: Settings, base: str, questions: list[str], n: int = 30, *, until: float = math.inf
) -> Lone:
    """``n`` lone requests after two that warm the path; none starts past ``until`` (time.time())."""
    import httpx
    import redis
    from ragline.broker.redis.keys import Keys
    from ragline.broker.state import apikeys

    key, _ = apikeys.create(
        redis.Redis.from_url(settings.redis.redis_url), Keys(settings.redis.key_prefix), "bench"
    )
    lone = Lone()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, timeout=120, headers=headers) as client:
        for i in range(n + 2):
            if time.time() >= until:
                break
            question = f"{questions[i % len(questions)]} ({uuid.uuid4().hex[:6]})"  # never a cache hit
            started = time.perf_counter()
            first, event, done = None, "", {}
            with client.stream("POST", "/v1/query/stream", json={"query": question, "index": FAQ_INDEX}) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                        if event == "token" and first is None:
                            first = time.perf_counter() - started
                    elif line.startswith("data: ") and event == "done":
                        done = json.loads(line.removeprefix("data: "))
            if i >= 2:  # the first two warm the path
                lone.first_s.append(first or float("nan"))
                timings = done.get("timings", {})
                lone.engine_first_ms.append(timings.get("first_token_ms", float("nan")))
                lone.queue_ms.append(timings.get("queue_ms", float("nan")))
                lone.retrieval_ms.append(timings.get("retrieval_ms", float("nan")))
                lone.prompt_tokens.append((done.get("usage") or {}).get("prompt_tokens", 0))
    return lone


def main() -> int:
    interrupt_on_signals()  # SIGTERM (a timeout, say) unwinds like Ctrl-C: the children are stopped
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile (starts faster)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    if not DOCS.exists():
        raise SystemExit(f"{DOCS} not found: apt-get install python3.11-doc")
    settings = Settings().replace(
        home=args.home,
        redis_url=args.redis_url,
        enforce_eager=args.eager,
        max_num_seqs=32,  # the engine must take 32 at once to be measured at 32
        max_new_tokens=args.max_tokens,
        default_index=FAQ_INDEX,
    )
    from ragline.workers.generation.model_prep import prepare_default_model

    share_models(args.home)
    prepare_default_model(settings)
    requests = faq_requests(32)
    prompts = build_prompts(settings, requests)
    print(f"{len(prompts)} prompts, {args.max_tokens} new tokens each", flush=True)

    rows = bench_transformers(settings, prompts, args.max_tokens)
    rows += bench_vllm(settings, requests, args.max_tokens)

    import redis

    redis.Redis.from_url(settings.redis.redis_url).flushdb()
    from ragline.workers.retrieval.ingest import ingest

    ingest(settings, [DOCS / "faq"], index_name=FAQ_INDEX, progress=False)
    port = free_port()
    env = settings_env(settings.replace(api_port=port))
    with Supervisor() as sup:  # stops them all on the way out, a SIGTERM or a timeout's included
        for name, cmd in (
            ("generation", "worker generation"),
            ("retrieval", "worker retrieval"),
            ("api", "api"),
        ):
            sup.start(name, [sys.executable, "-m", "ragline", *cmd.split()], env, stdout=subprocess.DEVNULL)
        _wait_live(settings, "generation", sup)
        _wait_live(settings, "retrieval", sup)
        asyncio.run(_via_worker(settings, requests[:4], 4))  # warm up
        for c in CONCURRENCY:
            tokens, wall, ttft, e2e = asyncio.run(_via_worker(settings, requests[: max(8, c)], c))
            rows.append(summarize("ragline worker (Celery + stream)", c, tokens, wall, ttft, e2e))
            print(rows[-1], flush=True)
        lone = lone_requests(settings, f"http://127.0.0.1:{port}", [q for q, _ in requests])
    return report(rows, lone, args.out)


def report(rows: list[dict], lone: Lone, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    print("\n| engine | concurrent | tok/s | TTFT P50 ms | TTFT P99 ms | e2e P50 ms | e2e P99 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['concurrency']} | {r['tok_s']:.0f} | {r['ttft_p50_ms']:.0f} | "
            f"{r['ttft_p99_ms']:.0f} | {r['e2e_p50_ms']:.0f} | {r['e2e_p99_ms']:.0f} |"
        )
    print(
        f"\nlone full RAG request through the API, {len(lone.first_s)} times: first token P50 "
        f"{pct(lone.first_s, 50) * 1000:.0f} ms, P99 {pct(lone.first_s, 99) * 1000:.0f} ms; "
        f"of which the engine's own time to first token (prefill of P50 "
        f"{pct(lone.prompt_tokens, 50):.0f} prompt tokens) P50 {pct(lone.engine_first_ms, 50):.0f} ms; "
        f"waiting in the queues P50 {pct(lone.queue_ms, 50):.1f} ms, embedding and search P50 "
        f"{pct(lone.retrieval_ms, 50):.1f} ms"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tok, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["engine"] for r in rows):
        mine = [r for r in rows if r["engine"] == name]
        xs = [r["concurrency"] for r in mine]
        ax_tok.plot(xs, [r["tok_s"] for r in mine], marker="o", label=name)
        ax_ttft.plot(xs, [r["ttft_p50_ms"] for r in mine], marker="o", label=name)
    ax_tok.set(xscale="log", xlabel="concurrent requests", ylabel="output tokens/s", title="throughput")
    ax_ttft.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="ms", title="TTFT P50")
    for ax in (ax_tok, ax_ttft):
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "generation.png", dpi=100)
    print(f"plot: {out / 'generation.png'}")

    def at(name: str, c: int) -> dict:
        return next(r for r in rows if r["engine"].startswith(name) and r["concurrency"] == c)

    headline = {
        "speedup_vs_sequential_32": at("ragline", 32)["tok_s"] / at("transformers sequential", 32)["tok_s"],
        "ragline_over_engine_32": at("ragline", 32)["tok_s"] / at("vLLM", 32)["tok_s"],
        "ttft_p50_ms_32": at("ragline", 32)["ttft_p50_ms"],
        "lone_ttft_p50_ms": pct(lone.first_s, 50) * 1000,
        # What the path adds to the engine's own time to first token on the same prompt, as the
        # worker measured it: retrieval, both queue hops and the relay of the first token.
        "lone_path_overhead_ms": pct(lone.first_s, 50) * 1000 - pct(lone.engine_first_ms, 50),
    }
    print(json.dumps({k: round(v, 3) for k, v in headline.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
