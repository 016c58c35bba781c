"""bench/gpu/run.py's measurements of the engines alone, each phase in a process of its own (so that
it gives the GPU back whole when it ends, and can be stopped at its deadline): Hugging Face
transformers one prompt at a time and as one static batch, and the bare vLLM ``AsyncLLM``.

A phase reads its inputs from the run folder (``spec.json``: the plan and the prompts) and the
settings from the environment, and appends each figure to ``<phase>.jsonl`` as soon as it has
it, so a phase stopped at its deadline leaves every figure it finished.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.generation import pct

ENGINE = "vLLM AsyncLLM alone"
RAGLINE = "ragline worker (Celery + stream)"
HF_SEQUENTIAL = "transformers one at a time"
HF_BATCH = "transformers static batch"


@dataclass(frozen=True, slots=True)
class Outcome:
    tokens: int
    first_s: float  # from submitting to the first token (nan: none came)
    e2e_s: float


@dataclass
class Row:
    """One engine at one concurrency: output tokens per second of the requests that finished."""

    engine: str
    concurrency: int
    tok_s: float
    requests: int  # finished
    tokens: int
    wall_s: float
    ttft_p50_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    e2e_p50_ms: float = math.nan
    e2e_p99_ms: float = math.nan
    errors: int = 0
    # Stopped at its time cap: the figure counts only what finished by then.
    partial: bool = False

    @classmethod
    def of(
        cls, engine: str, c: int, outcomes: list[Outcome], wall_s: float, *, errors: int = 0, partial: bool
    ) -> Row:
        tokens = sum(o.tokens for o in outcomes)
        ttft = [o.first_s for o in outcomes if not math.isnan(o.first_s)]
        e2e = [o.e2e_s for o in outcomes]
        return cls(
            engine=engine,
            concurrency=c,
            tok_s=tokens / wall_s if wall_s > 0 else math.nan,
            requests=len(outcomes),
            tokens=tokens,
            wall_s=wall_s,
            ttft_p50_ms=pct(ttft, 50) * 1000,
            ttft_p99_ms=pct(ttft, 99) * 1000,
            e2e_p50_ms=pct(e2e, 50) * 1000,
            e2e_p99_ms=pct(e2e, 99) * 1000,
            errors=errors,
            partial=partial,
        )


@dataclass
class Loop:
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    first_error: str = ""
    partial: bool = False


async def closed_loop(one: Callable[[int], Awaitable[Outcome]], *, c: int, n: int, cap_s: float) -> Loop:
    """``n`` requests, ``c`` in flight at a time (``one(i)`` serves the i-th), for at most
    ``cap_s``: what is in flight then is cancelled, and the figure is what finished by then over
    the whole cap (``partial``). Otherwise the wall time runs to the last answer."""
    loop = Loop()
    started = time.perf_counter()
    deadline = started + cap_s
    issued = 0

    async def client() -> None:
        nonlocal issued
        while issued < n and time.perf_counter() < deadline:
            i, issued = issued, issued + 1
            try:
                loop.outcomes.append(await one(i))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                loop.errors += 1
                loop.first_error = loop.first_error or f"{type(exc).__name__}: {exc}"

    tasks = [asyncio.create_task(client()) for _ in range(max(1, min(c, n)))]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, cap_s))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    ended = time.perf_counter()
    loop.partial = bool(pending) or len(loop.outcomes) + loop.errors < n
    loop.wall_s = cap_s if loop.partial else ended - started
    return loop


def requests_at(c: int, *, prompts: int, least: int) -> int:
    """Requests measured at concurrency ``c``: at least ``least`` and one wave of ``c``, and two
    waves while they fit in the prompts (prompts are reused in turn past their number)."""
    return max(least, c, min(2 * c, prompts))


# -- the run folder ----------------------------------------------------------------------------


def append_row(run: Path, phase: str, row: Row) -> None:
    with (run / f"{phase}.jsonl").open("a") as f:
        f.write(json.dumps(asdict(row)) + "\n")
    print(
        f"  {row.engine} at {row.concurrency}: {row.tok_s:.1f} tok/s"
        f"{' (partial)' if row.partial else ''}{f', {row.errors} errors' if row.errors else ''}",
        flush=True,
    )


def read_rows(run: Path, phase: str) -> list[Row]:
    path = run / f"{phase}.jsonl"
    if not path.exists():
        return []
    return [Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def read_spec(run: Path) -> dict[str, Any]:
    return json.loads((run / "spec.json").read_text())


def _cap(plan: dict[str, Any], c: int, deadline: float) -> float:
    """A point's time: its own cap, and never past the phase's deadline (a little kept for the
    engine's shutdown)."""
    return min(float(plan["point_cap_s"][str(c)]), deadline - time.time() - 5.0)


# -- transformers ------------------------------------------------------------------------------


def transformers_phase(run: Path, deadline: float) -> None:
    """One at a time (each prompt alone, as many as the plan says), then one static batch."""
    import torch
    from ragline.broker.config import host
    from ragline.broker.config.settings import get_settings
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = read_spec(run)
    plan, model_dir = spec["plan"], spec["model_dir"]
    settings = get_settings().generation
    device = torch.device(plan["device"])
    dtype = getattr(torch, plan["dtype"])
    if device.type == "cpu":
        torch.set_num_threads(host.cores_in(settings.cpu_omp_threads_bind))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    started = time.perf_counter()
    if plan["dummy"]:
        # Random weights of the same shape as vLLM's dummy ones, made where they are used.
        with device:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    model.eval()
    print(f"  transformers model ready in {time.perf_counter() - started:.0f} s", flush=True)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in spec["prompts"]]
    max_tokens = plan["max_tokens"]

    def generate(batch: list[list[int]], tokens: int, max_time_s: float) -> tuple[int, float]:
        """One padded ``generate`` call, every sequence exactly ``tokens`` long (end of sequence
        ignored) unless ``max_time_s`` runs out first; (tokens per sequence, seconds)."""
        width = max(len(ids) for ids in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
        begun = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=pad,
                max_time=max(0.1, max_time_s),
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return int(out.shape[1] - width), time.perf_counter() - begun

    # Warm-up of full length: the first long generation after loading is much slower than the next
    # (allocations, kernels' first use), and would count against one at a time.
    warmup_s = deadline - time.time() - plan["hf_sequential_cap_s"] - plan["hf_batch_cap_s"] - 5
    generate(prompts[:1], max_tokens, max(1.0, warmup_s))
    # One at a time: each prompt alone, as if requests arriving together were served in turn.
    seq_deadline = min(time.time() + plan["hf_sequential_cap_s"], deadline - plan["hf_batch_cap_s"] - 5)
    outcomes, partial = [], False
    for k in range(plan["hf_sequential"]):
        left = seq_deadline - time.time()
        if left <= 0:
            partial = True
            break
        n, seconds = generate([prompts[k % len(prompts)]], max_tokens, left)
        partial = partial or n < max_tokens
        # No streaming: the answer arrives whole, its first token with its last.
        outcomes.append(Outcome(n, seconds, seconds))
    wall = sum(o.e2e_s for o in outcomes)
    append_row(run, "transformers", Row.of(HF_SEQUENTIAL, 1, outcomes, wall, partial=partial))

    size = plan["hf_batch"]
    batch = [prompts[k % len(prompts)] for k in range(size)]
    left = min(plan["hf_batch_cap_s"], deadline - time.time() - 2)
    n, seconds = generate(batch, max_tokens, left)
    outcomes = [Outcome(n, seconds, seconds)] * size
    append_row(run, "transformers", Row.of(HF_BATCH, size, outcomes, seconds, partial=n < max_tokens))


# -- the bare vLLM engine ----------------------------------------------------------------------


def engine_phase(run: Path, deadline: float) -> None:
    asyncio.run(_engine_points(run, deadline))


async def _engine_points(run: Path, deadline: float) -> None:
    """vLLM's ``AsyncLLM`` driven from its own event loop, nothing of ragline's around it but
    the settings: the same engine arguments and sampling as the generation worker's."""
    import uuid

    from ragline.broker.config.settings import get_settings
    from ragline.workers.generation.engine import configure_cpu_env, engine_args, sampling_params
    from ragline.workers.generation.model_prep import generation_model_path
    from vllm.v1.engine.async_llm import AsyncLLM

    spec = read_spec(run)
    plan, prompts = spec["plan"], spec["prompts"]
    settings = get_settings()
    configure_cpu_env(settings.generation)  # as the worker does: the same environment, the same compile cache
    started = time.perf_counter()
    engine: Any = AsyncLLM.from_engine_args(engine_args(settings.generation, generation_model_path(settings)))
    print(f"  vLLM engine ready in {time.perf_counter() - started:.0f} s", flush=True)
    params = sampling_params(settings.generation, max_tokens=plan["max_tokens"])

    async def one(i: int) -> Outcome:
        begun = time.perf_counter()
        first, tokens = math.nan, 0
        async for output in engine.generate(prompts[i % len(prompts)], params, f"bare-{uuid.uuid4().hex}"):
            tokens += len(output.outputs[0].token_ids)
            if tokens and math.isnan(first):
                first = time.perf_counter() - begun
        return Outcome(tokens, first, time.perf_counter() - begun)

    try:
        await closed_loop(one, c=plan["warmup"], n=plan["warmup"], cap_s=60)
        for c in plan["points"]:
            cap = _cap(plan, c, deadline)
            if cap <= 0:
                break
            n = requests_at(c, prompts=len(prompts), least=plan["least_requests"])
            done = await closed_loop(one, c=c, n=n, cap_s=cap)
            if done.first_error:
                print(f"  {done.errors} failed at {c}: {done.first_error}", flush=True)
            append_row(
                run,
                "engine",
                Row.of(ENGINE, c, done.outcomes, done.wall_s, errors=done.errors, partial=done.partial),
            )
    finally:
        engine.shutdown()
        # Collected now: at the interpreter's exit its finalizer would shut it down again on
        # half-torn-down modules.
        engine = None
