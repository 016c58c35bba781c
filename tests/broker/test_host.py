"""Defaults from the host: each unset setting is computed from cores, memory and CPU features."""

from __future__ import annotations

import os

from broker import host
from broker.host import Host
from broker.settings import Settings

AVX2_ONLY = frozenset({"avx2", "fma"})
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
GIB = 2**30


def _host(cores: int = 2, flags: frozenset[str] = AVX2_ONLY, memory_gib: int = 24, gpus: int = 0) -> Host:
    return Host(cores=tuple(range(cores)), memory_bytes=memory_gib * GIB, cpu_flags=flags, gpus=gpus)


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
    wide = Host(cores=(*range(8), 10, 12, 13), memory_bytes=GIB, cpu_flags=AVX2_ONLY, gpus=0)
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
