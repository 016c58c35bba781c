"""Defaults from the host: each unset setting is computed from cores, memory and CPU features."""

from __future__ import annotations

import os

import pytest
from ragline.broker.config import host
from ragline.broker.config.gpus import Gpu
from ragline.broker.config.host import Host
from ragline.broker.config.settings import GenerationSettings, RetrievalSettings, Settings

AVX2_ONLY = frozenset({"avx2", "fma"})
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
GIB = 2**30
H200 = Gpu(0, "NVIDIA H200", memory_mib=143_771, used_mib=4, compute_capability=(9, 0), uuid="GPU-aa")
A100 = Gpu(0, "NVIDIA A100-SXM4-80GB", memory_mib=81_920, used_mib=4, compute_capability=(8, 0))
L4 = Gpu(0, "NVIDIA L4", memory_mib=23_034, used_mib=0, compute_capability=(8, 9))


def _host(
    cores: int = 2, flags: frozenset[str] = AVX2_ONLY, memory_gib: int = 24, gpus: int | tuple[Gpu, ...] = 0
) -> Host:
    devices = tuple(Gpu(i, "GPU", 0, 0) for i in range(gpus)) if isinstance(gpus, int) else gpus
    return Host(cores=tuple(range(cores)), memory_bytes=memory_gib * GIB, cpu_flags=flags, gpus=devices)


def test_dtype_follows_native_bf16() -> None:
    assert host.generation_dtype(_host(flags=AVX2_ONLY)).value == "float32"
    assert host.generation_dtype(_host(flags=AMX)).value == "bfloat16"
    assert host.generation_dtype(_host(flags=AVX2_ONLY, gpus=1)).value == "auto"


def test_max_num_seqs_by_kind_of_host() -> None:
    assert host.max_num_seqs(_host(flags=AVX2_ONLY)).value == 8
    assert host.max_num_seqs(_host(flags=AMX)).value == 32
    assert host.max_num_seqs(_host(gpus=1)).value == 256


def test_kv_cache_space_is_a_tenth_of_memory_within_bounds() -> None:
    assert host.cpu_kvcache_space_gib(_host(memory_gib=24)).value == 2
    assert host.cpu_kvcache_space_gib(_host(memory_gib=4)).value == 1
    assert host.cpu_kvcache_space_gib(_host(memory_gib=1024)).value == 16


def test_cores_come_from_the_affinity_not_a_literal() -> None:
    wide = Host(cores=(*range(8), 10, 12, 13), memory_bytes=GIB, cpu_flags=AVX2_ONLY)
    assert host.engine_cores(wide).value == "0-7,10,12-13"
    assert host.torch_threads(wide).value == 11
    assert host.core_list((3,)) == "3"


def test_detect_reads_this_process() -> None:
    here = host.detect()
    assert here.cores == host.usable_cores(os.sched_getaffinity(0), host.cpu_quota())
    assert here.memory_bytes > 0


def test_settings_fill_only_what_is_unset_and_say_why() -> None:
    here = host.detect()
    s = Settings().replace(dtype="float32", max_num_seqs=3)
    assert (s.generation.dtype, s.generation.max_num_seqs) == ("float32", 3)
    assert s.retrieval.torch_threads == len(here.cores)
    assert s.generation.cpu_omp_threads_bind == host.core_list(here.cores)
    line = s.host_defaults_line()
    assert "torch_threads=" in line and "cpu_kvcache_space_gib=" in line
    assert "dtype=" not in line and "max_num_seqs=" not in line
    # A copy with a value of its own no longer reports that value as the host's.
    assert "torch_threads=" not in s.replace(torch_threads=7).host_defaults_line()


def test_settings_from_the_environment_win(monkeypatch) -> None:
    monkeypatch.setenv("RAGLINE_CPU_OMP_THREADS_BIND", "1")
    monkeypatch.setenv("RAGLINE_DTYPE", "bfloat16")
    s = Settings()
    assert (s.generation.cpu_omp_threads_bind, s.generation.dtype) == ("1", "bfloat16")


def test_a_cpu_quota_bounds_the_cores(tmp_path) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert host.cpu_quota(cpu_max) == 2
    cpu_max.write_text("max 100000\n")
    assert host.cpu_quota(cpu_max) is None
    assert host.cpu_quota(tmp_path / "missing") is None
    assert host.usable_cores({7, 1, 3, 5}, 2) == (1, 3)
    assert host.usable_cores({7, 1}, None) == (1, 7)


def test_the_engine_gets_cores_of_its_own_on_a_cpu_host() -> None:
    two = host.core_split(_host(cores=2))
    assert two is not None and two.engine == (1,) and two.others == (0,)
    many = host.core_split(_host(cores=16))
    assert many is not None and many.others == (0, 1, 2, 3) and many.engine == tuple(range(4, 16))
    assert host.core_split(_host(cores=1)) is None  # nothing to split
    assert host.core_split(_host(cores=2, gpus=1)) is None  # the engine computes on the GPU


# -- defaults from the GPU (a faked device list) ---------------------------------------------------


def test_an_idle_gpu_gives_the_engine_nine_tenths_of_its_memory() -> None:
    choice = host.gpu_memory_utilization(_host(gpus=(H200,)))
    assert choice.value == 0.9 and "GPU 0 (NVIDIA H200" in choice.reason


def test_memory_other_processes_hold_comes_off_the_engines_share() -> None:
    busy = Gpu(1, "NVIDIA H200", memory_mib=100_000, used_mib=30_000, compute_capability=(9, 0))
    choice = host.gpu_memory_utilization(_host(gpus=(busy,)))
    assert choice.value == 0.65  # 70% free, less the 5% margin
    assert "GPU 1" in choice.reason and "free" in choice.reason
    # One engine over several GPUs: the fullest decides.
    assert host.gpu_memory_utilization(_host(gpus=(H200, busy))).value == 0.65
    # Unknown memory (GPUs seen in /proc only), or no GPU: the usual share.
    assert host.gpu_memory_utilization(_host(gpus=1)).value == 0.9
    assert "unused" in host.gpu_memory_utilization(_host()).reason


def test_batched_tokens_follow_the_gpu_class() -> None:
    assert host.max_num_batched_tokens(_host(gpus=(H200,))).value == 8192
    assert host.max_num_batched_tokens(_host(gpus=(A100,))).value == 2048  # 80 GiB, but not Hopper
    assert host.max_num_batched_tokens(_host(gpus=(L4,))).value == 2048
    assert host.max_num_batched_tokens(_host(gpus=(H200, L4))).value == 2048  # the smallest decides
    assert host.max_num_batched_tokens(_host()).value == 2048


def test_kv_block_size_is_the_engines_own_per_device() -> None:
    assert host.kv_block_size(_host(gpus=(H200,))).value == 16
    assert host.kv_block_size(_host()).value == 128


def test_the_ingest_encoder_takes_a_free_gpu_and_queries_stay_on_the_cpu() -> None:
    engine = Gpu(0, "NVIDIA H200", memory_mib=143_771, used_mib=129_000, compute_capability=(9, 0))
    spare = Gpu(3, "NVIDIA H200", memory_mib=143_771, used_mib=300, compute_capability=(9, 0))
    # torch's numbering: the second GPU this process may use, whatever nvidia-smi calls it.
    assert host.ingest_encoder_device(_host(gpus=(engine, spare))).value == "cuda:1"
    assert host.ingest_encoder_device(_host(gpus=(engine,))).value == "cpu"
    assert host.ingest_encoder_device(_host()).value == "cpu"
    assert host.query_encoder_device(_host(gpus=(spare,))).value == "cpu"


@pytest.mark.parametrize("gpu", [H200, L4])
def test_with_a_gpu_every_generation_default_is_chosen_and_says_why(
    monkeypatch: pytest.MonkeyPatch, gpu: Gpu
) -> None:
    monkeypatch.setattr(host, "detect", lambda: _host(cores=16, gpus=(gpu,)))
    for name in ("DTYPE", "ENFORCE_EAGER", "MAX_NUM_SEQS", "GPU_MEMORY_UTILIZATION", "KV_BLOCK_SIZE"):
        monkeypatch.delenv(f"RAGLINE_{name}", raising=False)
    g = GenerationSettings()
    chosen = g.host_choices()
    assert (g.dtype, g.enforce_eager, g.enable_prefix_caching, g.enable_chunked_prefill) == (
        "auto",
        False,
        True,
        True,
    )
    assert (g.kv_block_size, g.gpu_memory_utilization, g.max_num_seqs) == (16, 0.9, 256)
    for name in (
        "dtype",
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enforce_eager",
        "enable_prefix_caching",
        "kv_block_size",
    ):
        assert chosen[name].reason, name
    assert "CUDA graphs" in chosen["enforce_eager"].reason
    assert RetrievalSettings().query_encoder_device == "cpu"


def test_a_setting_given_is_not_the_hosts_even_when_it_equals_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGLINE_ENFORCE_EAGER", "false")
    monkeypatch.setenv("RAGLINE_KV_BLOCK_SIZE", "32")
    g = GenerationSettings()
    assert (g.enforce_eager, g.kv_block_size) == (False, 32)
    assert "enforce_eager" not in g.host_choices() and "kv_block_size" not in g.host_choices()
    assert "enable_prefix_caching" in g.host_choices()
