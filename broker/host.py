"""What this host offers a process, and the defaults that follow from it.

Settings left unset (empty or 0) are filled from here when the settings group that owns them
(:class:`~broker.settings.GenerationSettings`, :class:`~broker.settings.RetrievalSettings`) is
built, so every process sizes itself from the cores it may use (``os.sched_getaffinity``: a
container's or a ``taskset``'s share, not the machine's), its memory and its CPU's features,
and not from the box the project was developed on. Each value filled in keeps its reason, and
each worker logs them once at start. Reading the host is a few small ``/proc`` reads; nothing
here imports torch or vllm.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Instruction sets with which a CPU computes bf16 natively. Without them vLLM's CPU backend
# converts every bf16 operand, and bf16 runs slower than float32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class Host:
    cores: tuple[int, ...]  # the CPUs this process may run on, as many as its CPU quota allows
    memory_bytes: int
    cpu_flags: frozenset[str]
    gpus: int  # NVIDIA devices the driver reports

    @property
    def native_bf16(self) -> bool:
        return bool(self.cpu_flags & NATIVE_BF16_FLAGS)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _gpus(root: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    try:
        return sum(1 for _ in root.iterdir())
    except OSError:
        return 0


def cpu_quota(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, as a container's CPU limit
    sets it), or None without a quota. A quota does not shrink the affinity mask: a pod limited
    to 2 CPUs on a 64-core node still sees 64, and 64 threads there would only wait on each other."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cores(affinity: set[int], quota: int | None) -> tuple[int, ...]:
    ordered = tuple(sorted(affinity))
    return ordered if quota is None else ordered[:quota]


@lru_cache(maxsize=1)
def detect() -> Host:
    return Host(
        cores=usable_cores(os.sched_getaffinity(0), cpu_quota()),
        memory_bytes=_memory_bytes(),
        cpu_flags=_cpu_flags(),
        gpus=_gpus(),
    )


def core_list(cores: tuple[int, ...]) -> str:
    """CPU ids as ``taskset``/vLLM write them: ``0-3,8,10-11``."""
    parts: list[str] = []
    ordered = sorted(cores)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def cores_in(cores: str) -> int:
    """How many CPU ids a list such as ``0-3,8`` names (at least one)."""
    count = 0
    for part in filter(None, (p.strip() for p in cores.split(","))):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return max(1, count)


@dataclass(frozen=True, slots=True)
class Choice:
    value: object
    reason: str


def generation_dtype(host: Host) -> Choice:
    if host.gpus:
        return Choice("auto", "a GPU host: the model's own dtype, as vLLM chooses")
    if host.native_bf16:
        return Choice("bfloat16", "the CPU computes bf16 natively (AVX-512 BF16 or AMX)")
    return Choice("float32", "the CPU has no native bf16 (no AVX-512 BF16, no AMX): bf16 would be emulated")


def max_num_seqs(host: Host) -> Choice:
    if host.gpus:
        return Choice(256, "a GPU host: vLLM's own default")
    if host.native_bf16:
        return Choice(32, "a CPU with native bf16: throughput still rises at 32 sequences")
    # Without native bf16 the CPU backend's throughput peaks near 8 concurrent sequences and
    # falls beyond (docs/performance.md); admission queues the rest.
    return Choice(8, "a CPU without native bf16: throughput stops rising past about 8 sequences")


def cpu_kvcache_space_gib(host: Host) -> Choice:
    # A tenth of memory, at least 1 GiB and at most 16: the engine, the encoder and the index
    # share the host, and the default model needs far less than that per sequence.
    gib = min(16, max(1, int(host.memory_gib / 10)))
    return Choice(gib, f"a tenth of the host's {host.memory_gib:.0f} GiB (1-16 GiB)")


def engine_cores(host: Host) -> Choice:
    return Choice(core_list(host.cores), f"every core this process may use ({len(host.cores)})")


def torch_threads(host: Host) -> Choice:
    return Choice(len(host.cores), f"one per core this process may use ({len(host.cores)})")


@dataclass(frozen=True, slots=True)
class CoreSplit:
    """Which cores ``ragline up`` gives the engine, and which everything else (encoder, API,
    Redis, webhook delivery, Flower), when they share one CPU host."""

    engine: tuple[int, ...]
    others: tuple[int, ...]
    reason: str


def core_split(host: Host) -> CoreSplit | None:
    """Cores of their own for the engine and for the rest, or None (one core, or a GPU host,
    where the engine does not compute on the CPU).

    On shared cores each stage's threads preempt the other's at every step: the engine's OpenMP
    threads wait at barriers for a thread the encoder displaced, and the encoder's batches stall
    behind the engine, so retrieval beside generation queues into seconds. Apart, each keeps
    most of its solo speed (docs/architecture.md). The rest gets a quarter of the cores, at
    least one: the encoder is the smaller model and batches its queries.
    """
    if host.gpus or len(host.cores) < 2:
        return None
    n = max(1, len(host.cores) // 4)
    others, engine = host.cores[:n], host.cores[n:]
    return CoreSplit(
        engine,
        others,
        f"engine on {core_list(engine)}, encoder and the rest on {core_list(others)} "
        f"(a quarter of the {len(host.cores)} cores, at least one)",
    )
