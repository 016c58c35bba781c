"""bench/gpu/run.py: its plan fits the budget, its driver caps a point, its inputs are what the GPU
run loads, and its dry run completes on the CPU and leaves no process behind (even when stopped)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings

import bench.gpu.run
from bench.generation import DOCS, Lone
from bench.gpu.engines import ENGINE, HF_SEQUENTIAL, RAGLINE, Outcome, Row, closed_loop, requests_at
from bench.gpu.run import DRY_RUN, GPU, TARGETS, check_budget, figures, met
from bench.gpu.stack import StackResult

ROOT = Path(__file__).resolve().parents[3]  # the checkout (tests/bench/gpu/ is three down)
FIGURES = (
    "vllm_over_hf_sequential_32",
    "ragline_over_engine_32",
    "ragline_over_engine_128",
    "engine_tok_s_256",
    "api_first_token_ms_p50",
    "api_first_token_ms_from_100",
    "predict_err_p90",
)


def test_the_gpu_run_plans_its_phases_within_eight_minutes() -> None:
    check_budget(GPU)
    assert GPU.total_s() <= 480
    doc = bench.gpu.run.__doc__ or ""
    for phase, limit in GPU.limits.items():
        assert f"- {phase}: {limit:.0f} s." in doc, f"the docstring does not state the {phase} phase's limit"
    caps = ", ".join(f"{c}: {GPU.point_cap_s[str(c)]:.0f} s" for c in GPU.points)
    assert caps in " ".join(doc.split())
    # The headline figures' points come first.
    assert list(GPU.points[:3]) == sorted(set(GPU.at.values()))


def test_a_plan_over_budget_is_refused() -> None:
    over = dataclasses.replace(GPU, limits={**GPU.limits, "engine": GPU.limits["engine"] + 60})
    with pytest.raises(ValueError, match="budget"):
        check_budget(over)
    check_budget(dataclasses.replace(over, dry_run=True))  # the dry run has no budget


@pytest.mark.parametrize("plan", [GPU, DRY_RUN], ids=["gpu", "dry-run"])
def test_every_headline_figure_is_taken_at_a_measured_point(plan: bench.gpu.run.Plan) -> None:
    assert set(plan.at.values()) <= set(plan.points) == {int(c) for c in plan.point_cap_s}


def test_requests_per_point() -> None:
    assert [requests_at(c, prompts=64, least=4) for c in (1, 8, 32, 128, 256)] == [4, 16, 64, 128, 256]
    assert [requests_at(c, prompts=4, least=2) for c in (1, 4)] == [2, 4]


def _sleeper(seconds: float, tokens: int = 10) -> Callable[[int], Awaitable[Outcome]]:
    async def one(i: int) -> Outcome:
        await asyncio.sleep(seconds)
        return Outcome(tokens, seconds / 2, seconds)

    return one


def test_closed_loop_runs_to_the_last_answer() -> None:
    loop = asyncio.run(closed_loop(_sleeper(0.05), c=2, n=4, cap_s=10))
    assert not loop.partial and len(loop.outcomes) == 4
    assert 0.09 <= loop.wall_s < 1.0  # two waves of two


def test_closed_loop_stops_at_its_cap_with_what_finished() -> None:
    cancelled = []

    async def one(i: int) -> Outcome:
        try:
            await asyncio.sleep(0.05 if i < 2 else 30)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return Outcome(10, 0.01, 0.05)

    started = time.perf_counter()
    loop = asyncio.run(closed_loop(one, c=2, n=8, cap_s=0.5))
    assert time.perf_counter() - started < 2
    assert loop.partial and len(loop.outcomes) == 2 and loop.wall_s == 0.5
    assert sorted(cancelled) == [2, 3]  # what was in flight at the cap is cancelled, not awaited


def test_closed_loop_counts_errors_and_goes_on() -> None:
    async def one(i: int) -> Outcome:
        if i == 1:
            raise RuntimeError("500: generation failed")
        return Outcome(5, 0.0, 0.0)

    loop = asyncio.run(closed_loop(one, c=1, n=3, cap_s=5))
    assert (len(loop.outcomes), loop.errors, loop.partial) == (2, 1, False)
    assert "generation failed" in loop.first_error


def _row(engine: str, c: int, tok_s: float) -> Row:
    return Row(engine=engine, concurrency=c, tok_s=tok_s, requests=1, tokens=1, wall_s=1.0)


def test_figures_and_targets() -> None:
    rows = [
        _row(HF_SEQUENTIAL, 1, 20.0),
        _row(ENGINE, 32, 400.0),
        _row(ENGINE, 128, 1000.0),
        _row(ENGINE, 256, 1500.0),
        _row(RAGLINE, 32, 390.0),
        _row(RAGLINE, 128, 900.0),
    ]
    stack = StackResult(lone=Lone(first_s=[0.1, 0.15, 0.2], engine_first_ms=[40.0, 50.0, 60.0]))
    f = figures(GPU, rows, stack)
    assert f["vllm_over_hf_sequential_32"] == pytest.approx(20.0)
    assert f["ragline_over_engine_32"] == pytest.approx(0.975)
    assert f["ragline_over_engine_128"] == pytest.approx(0.9)
    assert f["engine_tok_s_256"] == 1500.0
    assert f["api_first_token_ms_p50"] == pytest.approx(150.0)
    assert f["api_first_token_ms_from_100"] == pytest.approx(50.0)
    assert math.isnan(f["predict_err_p90"])  # no clients' load measured
    assert met("ragline_over_engine_32", f["ragline_over_engine_32"]) is True
    assert met("ragline_over_engine_128", f["ragline_over_engine_128"]) is False
    assert met("predict_err_p90", f["predict_err_p90"]) is None
    assert set(TARGETS) <= set(f)
    # A point never measured is missing, not zero.
    assert math.isnan(figures(GPU, rows[:2], stack)["ragline_over_engine_128"])


# -- the inputs the GPU run loads --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from ragline.workers.generation.model_prep import default_model_dir, prepare_default_model

    settings = Settings()
    prepare_default_model(settings)
    return default_model_dir(settings)


@pytest.mark.model
def test_the_dummy_model_has_llama3_8b_s_shape_and_the_tokenizer_s_vocabulary(
    smollm2: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from bench.gpu.inputs import write_dummy_model

    folder = write_dummy_model(tmp_path / "m", smollm2)
    assert not list(folder.glob("*.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    assert config.vocab_size == len(tokenizer) == len(AutoTokenizer.from_pretrained(smollm2))
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    # Llama-3-8B's 8.03e9 less the embedding and head rows of the smaller vocabulary.
    assert params == 8_030_261_248 - 2 * 4096 * (128_256 - len(tokenizer))
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.model
@pytest.mark.skipif(not (DOCS / "faq").is_dir(), reason="needs Debian's python3.11-doc")
def test_rag_prompts_are_built_by_the_worker_s_builder_within_their_size(smollm2: Path) -> None:
    from ragline.workers.generation.prompt import build_rag_prompt
    from transformers import AutoTokenizer

    from bench.gpu.inputs import rag_requests

    settings = Settings().replace(max_new_tokens=128).generation
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    requests = rag_requests(settings, tokenizer, DOCS, 6)
    assert len({r.question for r in requests}) == 6
    for r in requests:
        assert 1000 <= r.prompt_tokens <= 1500
        assert r.question.endswith("?") and len(r.sources) >= 1
        # What the worker builds from the task's question and sources: the same prompt, no source dropped.
        rebuilt = build_rag_prompt(settings, tokenizer, r.question, list(r.sources))
        assert (rebuilt.text, rebuilt.sources_dropped) == (r.prompt, 0)


@pytest.mark.integration
@pytest.mark.vllm
def test_the_engine_loads_dummy_weights_from_the_setting(smollm2: Path, tmp_path: Path) -> None:
    """RAGLINE_LOAD_FORMAT reaches vLLM: a Llama-shaped folder without weights serves, and the
    minimum makes every answer exactly its length (the end of sequence ignored)."""
    from ragline.workers.generation.engine import EngineHost

    from bench.gpu.inputs import LLAMA3_8B, write_dummy_model

    tiny = LLAMA3_8B | {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    folder = write_dummy_model(tmp_path / "tiny", smollm2, tiny, dtype="float32")
    settings = Settings().replace(
        generation_model=str(folder),
        load_format="dummy",
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=2,
        min_new_tokens=12,
        cpu_kvcache_space_gib=1,
    )
    engine = EngineHost(settings.generation, str(folder))
    engine.start()
    try:
        deltas = list(engine.stream("dummy-1", "Where is the FAQ?", max_tokens=12, timeout_s=60))
    finally:
        engine.shutdown()
    assert deltas[-1].finished and deltas[-1].completion_tokens == 12


# -- the dry run -------------------------------------------------------------------------------


def _processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line or environment holds ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                    continue
            blobs = [Path(f"/proc/{entry}/{name}").read_bytes() for name in ("cmdline", "environ")]
        except OSError:
            continue
        if any(text.encode() in blob for blob in blobs):
            command = blobs[0].replace(b"\0", b" ")[:160].decode(errors="replace")
            found.append(f"{entry}: {command}")
    return found


def _dry_run(tmp_path: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.gpu",
            "--dry-run",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not (DOCS / "faq").is_dir(), reason="needs Debian's python3.11-doc")
def test_the_dry_run_measures_every_figure_and_leaves_nothing_running(tmp_path: Path) -> None:
    proc = _dry_run(tmp_path)
    try:
        output, _ = proc.communicate(timeout=2400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-5000:]
    last = json.loads(output.strip().splitlines()[-1])
    for name in FIGURES:
        assert isinstance(last[name], int | float) and math.isfinite(last[name]), (name, last[name])
    assert set(last["targets"]) == set(TARGETS) and set(last["met"]) == set(TARGETS)
    assert last["dry_run"] is True and last["failed"] == []
    assert "| ragline worker (Celery + stream) | 4 |" in output
    assert _processes_mentioning(str(tmp_path)) == []
    assert not list(tmp_path.glob("ragline-gpu-*"))  # the run's temporary folder is gone


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not (DOCS / "faq").is_dir(), reason="needs Debian's python3.11-doc")
def test_sigterm_while_the_stack_starts_stops_every_process(tmp_path: Path) -> None:
    """A timeout's SIGTERM as the stack's workers and engine core start: all of them stop."""
    proc = _dry_run(tmp_path)
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 900
        for line in proc.stdout:
            if line.startswith("phase stack") or time.monotonic() > deadline:
                break
        assert proc.poll() is None, "the dry run ended before its stack phase"
        time.sleep(20)  # the generation worker is starting its engine, the FAQ being ingested
        assert _processes_mentioning(str(tmp_path)), "nothing of the stack was running"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    time.sleep(1)
    assert _processes_mentioning(str(tmp_path)) == []
