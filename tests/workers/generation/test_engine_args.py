"""Every default chosen from the device reaches the engine's arguments (vLLM imported, no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.broker.config import host
from ragline.broker.config.gpus import Gpu
from ragline.broker.config.settings import GenerationSettings

pytestmark = pytest.mark.slow  # imports vLLM
# (The model is a folder that exists: with HF_HUB_OFFLINE=1 vLLM resolves any other name on the hub.)

H200 = Gpu(0, "NVIDIA H200", memory_mib=143_771, used_mib=4, compute_capability=(9, 0))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DTYPE", "ENFORCE_EAGER", "MAX_NUM_SEQS", "KV_BLOCK_SIZE", "GPU_MEMORY_UTILIZATION"):
        monkeypatch.delenv(f"RAGLINE_{name}", raising=False)


@pytest.mark.usefixtures("clean_env")
def test_a_gpu_engine_gets_the_devices_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ragline.workers.generation.engine import engine_args

    here = host.detect()
    two = (H200, Gpu(1, "NVIDIA H200", 143_771, 4, (9, 0)))
    monkeypatch.setattr(host, "detect", lambda: host.Host(here.cores, here.memory_bytes, here.cpu_flags, two))
    args = engine_args(GenerationSettings(tensor_parallel=2), str(tmp_path))
    assert (args.dtype, args.enforce_eager, args.enable_prefix_caching, args.enable_chunked_prefill) == (
        "auto",
        False,
        True,
        True,
    )
    assert (args.block_size, args.max_num_seqs, args.max_num_batched_tokens) == (16, 256, 8192)
    assert (args.gpu_memory_utilization, args.tensor_parallel_size) == (0.9, 2)


@pytest.mark.usefixtures("clean_env")
def test_a_cpu_engine_keeps_vllms_cpu_blocks_and_batch(tmp_path: Path) -> None:
    from ragline.workers.generation.engine import engine_args

    args = engine_args(GenerationSettings(), str(tmp_path))
    assert (args.block_size, args.max_num_batched_tokens, args.tensor_parallel_size) == (128, 2048, 1)
    assert args.enable_chunked_prefill and args.enable_prefix_caching
