"""The GPUs a process may use, read from nvidia-smi (a fake one here) without CUDA."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from ragline.broker.config import gpus
from ragline.broker.config.gpus import Gpu, detect_gpus, parse_nvidia_smi, visible

# What `nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap,uuid
# --format=csv,noheader,nounits` prints on a host with four GPUs, one of them busy.
FOUR = """\
0, NVIDIA H200, 143771, 129004, 9.0, GPU-0a1b
1, NVIDIA H200, 143771, 4, 9.0, GPU-1c2d
2, NVIDIA H200, 143771, 4, 9.0, GPU-2e3f
3, NVIDIA H200, 143771, [N/A], 9.0, GPU-3a4b
"""


def test_nvidia_smi_lines_parse_into_gpus() -> None:
    listed = parse_nvidia_smi(FOUR + "\nNo devices were found\n")
    assert [g.index for g in listed] == [0, 1, 2, 3]
    first = listed[0]
    assert (first.name, first.memory_mib, first.used_mib) == ("NVIDIA H200", 143771, 129004)
    assert (first.compute_capability, first.uuid) == ((9, 0), "GPU-0a1b")
    assert listed[3].used_mib == 0  # [N/A]: unknown
    assert 0.10 < first.free_share < 0.11
    assert first.describe() == "GPU 0 (NVIDIA H200, 126.0 of 140 GiB in use)"


def test_cuda_visible_devices_picks_and_orders_them() -> None:
    listed = parse_nvidia_smi(FOUR)
    assert visible(listed, None) == listed
    assert [g.index for g in visible(listed, "2,0")] == [2, 0]
    assert [g.index for g in visible(listed, "GPU-1c")] == [1]  # a UUID prefix, as CUDA takes it
    assert visible(listed, "") == ()
    # CUDA stops at the first entry it cannot find: so does this.
    assert [g.index for g in visible(listed, "1,7,2")] == [1]
    assert visible(listed, "MIG-5e6f") == ()


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` first on PATH that prints FOUR and records its arguments."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat <<EOF\n{FOUR}EOF\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return tmp_path


def test_detect_asks_nvidia_smi_for_what_the_defaults_need(fake_nvidia_smi: Path) -> None:
    found = detect_gpus({})
    assert [g.index for g in found] == [0, 1, 2, 3]
    args = (fake_nvidia_smi / "args").read_text()
    assert "--query-gpu=index,name,memory.total,memory.used,compute_cap,uuid" in args
    assert "--format=csv,noheader,nounits" in args
    assert [g.index for g in detect_gpus({"CUDA_VISIBLE_DEVICES": "3"})] == [3]


def test_a_process_told_to_use_no_gpu_does_not_ask_the_driver(fake_nvidia_smi: Path) -> None:
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert not (fake_nvidia_smi / "args").exists()


def test_without_nvidia_smi_the_driver_count_stands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpus, "_driver_gpus", lambda: 2)
    assert detect_gpus({}) == (Gpu(0, "NVIDIA GPU", 0, 0), Gpu(1, "NVIDIA GPU", 0, 0))
    monkeypatch.setattr(gpus, "_driver_gpus", lambda: 0)
    assert detect_gpus({}) == ()


def test_a_failing_nvidia_smi_falls_back_to_the_driver_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpus, "_driver_gpus", lambda: 1)
    assert [g.known for g in detect_gpus({})] == [False]
