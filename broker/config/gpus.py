"""The NVIDIA GPUs a process may use, read without CUDA: ``nvidia-smi`` (it comes with the driver,
and the NVIDIA container runtime mounts it), else the driver's ``/proc`` entries (count only).

Nothing here imports torch or vllm: the API and every worker read the host the same way, and a
process that must not touch a GPU (``CUDA_VISIBLE_DEVICES=""``) does not even ask the driver.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One NVIDIA GPU as ``nvidia-smi`` reports it. Memory is 0 where it could not be read (a
    driver without ``nvidia-smi``: the GPU is known only from ``/proc``)."""

    index: int  # nvidia-smi's (PCI bus order): what `--gpus` and CUDA_VISIBLE_DEVICES name
    name: str
    memory_mib: int
    used_mib: int
    compute_capability: tuple[int, int] = (0, 0)
    uuid: str = ""

    @property
    def known(self) -> bool:
        return self.memory_mib > 0

    @property
    def free_share(self) -> float:
        """The share of its memory not in use (1.0 where unknown)."""
        return (self.memory_mib - self.used_mib) / self.memory_mib if self.known else 1.0

    def describe(self) -> str:
        if not self.known:
            return f"GPU {self.index} ({self.name})"
        used, total = self.used_mib / 1024, self.memory_mib / 1024
        return f"GPU {self.index} ({self.name}, {used:.1f} of {total:.0f} GiB in use)"


# nvidia-smi answers in well under a second with the driver loaded; without persistence mode its
# first call initialises every GPU, which can take seconds on a large host.
NVIDIA_SMI_TIMEOUT_S = 10.0
NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,compute_cap,uuid"


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits``, one GPU a line;
    a field it cannot read (``[N/A]``) counts as unknown."""

    def number(field: str) -> int:
        try:
            return int(float(field))
        except ValueError:
            return 0

    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[0].isdigit():
            continue
        major, _, minor = (fields[4] if len(fields) > 4 else "").partition(".")
        capability = (number(major), number(minor)) if major.isdigit() else (0, 0)
        gpus.append(
            Gpu(
                index=int(fields[0]),
                name=fields[1],
                memory_mib=number(fields[2]),
                used_mib=number(fields[3]),
                compute_capability=capability,
                uuid=fields[5] if len(fields) > 5 else "",
            )
        )
    return tuple(sorted(gpus, key=lambda g: g.index))


def visible(gpus: tuple[Gpu, ...], cuda_visible_devices: str | None) -> tuple[Gpu, ...]:
    """The GPUs a process with this ``CUDA_VISIBLE_DEVICES`` may use, in its order: unset, all of
    them; each entry an index or a GPU UUID (or its prefix, as CUDA accepts). An entry that names
    none of them (a MIG instance, a typo) ends the list there, as it does for CUDA."""
    if cuda_visible_devices is None:
        return gpus
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = [
            g
            for g in gpus
            if (entry.isdigit() and g.index == int(entry))
            or (entry.startswith("GPU-") and g.uuid.startswith(entry))
        ]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return tuple(chosen)


def _driver_gpus(root: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    try:
        return sum(1 for _ in root.iterdir())
    except OSError:
        return 0


def detect_gpus(env: Mapping[str, str] = os.environ) -> tuple[Gpu, ...]:
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return ()  # hidden on purpose: no driver call at all (the API, CPU-only workers)
    listed: tuple[Gpu, ...] = ()
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is not None:
        try:
            listed = parse_nvidia_smi(
                subprocess.run(
                    [nvidia_smi, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=NVIDIA_SMI_TIMEOUT_S,
                    check=True,
                ).stdout
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("nvidia-smi failed (%s): GPUs known from /proc only, their memory unknown", exc)
    if not listed:
        listed = tuple(Gpu(i, "NVIDIA GPU", 0, 0) for i in range(_driver_gpus()))
    return visible(listed, env.get("CUDA_VISIBLE_DEVICES"))
