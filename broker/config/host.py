"""What this host offers a process, and the defaults that follow from it.

Settings left unset (empty or 0) are filled from here when the settings group that owns them
(:class:`~ragline.broker.config.settings.GenerationSettings`,
:class:`~ragline.broker.config.settings.RetrievalSettings`) is
built, so every process sizes itself from the cores it may use (``os.sched_getaffinity``: a
container's or a ``taskset``'s share, not the machine's), its memory, its CPU's features and the
GPUs it may use (``CUDA_VISIBLE_DEVICES``' share of those the driver lists), and not from the box
the project was developed on. Each value filled in keeps its reason, and each worker logs them
once at start. Reading the host is a few small ``/proc`` reads and, where an NVIDIA driver is
installed, one ``nvidia-smi`` call; nothing here imports torch or vllm.

Which defaults a GPU chooses and which the CPU host is said in the README's settings table.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ragline.broker.config.gpus import Gpu, detect_gpus

# Instruction sets with which a CPU computes bf16 natively. Without them vLLM's CPU backend
# converts every bf16 operand, and bf16 runs slower than float32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class Host:
    cores: tuple[int, ...]  # the CPUs this process may run on, as many as its CPU quota allows
    memory_bytes: int
    cpu_flags: frozenset[str]
    # The GPUs this process may use, in CUDA's order when CUDA_DEVICE_ORDER=PCI_BUS_ID (what
    # ragline sets for the processes it starts): the n-th is the device torch calls cuda:n.
    gpus: tuple[Gpu, ...] = ()

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
        gpus=detect_gpus(),
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
        return Choice("auto", "a GPU: the model's own dtype (bf16 for most), as vLLM chooses")
    if host.native_bf16:
        return Choice("bfloat16", "the CPU computes bf16 natively (AVX-512 BF16 or AMX)")
    return Choice("float32", "the CPU has no native bf16 (no AVX-512 BF16, no AMX): bf16 would be emulated")


def max_num_seqs(host: Host) -> Choice:
    if host.gpus:
        # vLLM's server allows 1024 on GPUs of 70 GiB and more; each sequence here holds a worker
        # thread, and an 8B model's KV cache for RAG-sized prompts (~1.5k tokens, 128 KiB a token)
        # on an 80 GiB GPU fills near 256 sequences: more would only wait inside the engine.
        return Choice(256, "a GPU: vLLM's default below 70 GiB; RAG-sized prompts fill the KV cache near it")
    if host.native_bf16:
        return Choice(32, "a CPU with native bf16: throughput still rises at 32 sequences")
    # Without native bf16 the CPU backend's throughput peaks near 8 concurrent sequences and
    # falls beyond (docs/performance.md); admission queues the rest.
    return Choice(8, "a CPU without native bf16: throughput stops rising past about 8 sequences")


# The share of an otherwise idle GPU an engine takes for weights, activations and KV cache; the
# rest holds the CUDA context, cuBLAS and NCCL workspaces, CUDA graphs' pools, and an encoder
# beside the engine.
GPU_MEMORY_SHARE = 0.90
# What an engine leaves of the memory that is free when something else already holds some.
GPU_MEMORY_MARGIN = 0.05
# A GPU whose processes hold less than this is free (an idle CUDA context is a few hundred MiB;
# an engine holds most of the GPU).
FREE_GPU_USED_MIB = 1024


def gpu_memory_utilization(host: Host) -> Choice:
    """vLLM's share of each GPU's whole memory: the engine refuses to start when that much is not
    free, so memory held by other processes comes off it."""
    if not host.gpus:
        return Choice(GPU_MEMORY_SHARE, "no GPU: unused (the CPU's KV cache is cpu_kvcache_space_gib)")
    tightest = min(host.gpus, key=lambda g: g.free_share)
    if not tightest.known:
        return Choice(GPU_MEMORY_SHARE, "GPU memory unknown (no nvidia-smi): vLLM's usual share")
    # Whole hundredths, rounded down (the epsilon keeps 0.65 from flooring to 0.64).
    share = math.floor(min(GPU_MEMORY_SHARE, tightest.free_share - GPU_MEMORY_MARGIN) * 100 + 1e-9) / 100
    if share >= GPU_MEMORY_SHARE:
        return Choice(
            GPU_MEMORY_SHARE,
            f"{tightest.describe()}: {GPU_MEMORY_SHARE:.0%} for weights and KV cache, the rest for the "
            "CUDA context, workspaces and graphs",
        )
    return Choice(
        max(0.01, share),
        f"{tightest.describe()}: what other processes leave free, less {GPU_MEMORY_MARGIN:.0%}",
    )


def max_num_batched_tokens(host: Host) -> Choice:
    """Tokens one engine step schedules: with chunked prefill, the decodes in flight plus chunks
    of new prompts up to this. More raises throughput and each step's time (every sequence in
    the batch waits for the step)."""
    if not host.gpus:
        return Choice(2048, "a CPU: vLLM's engine default; a RAG prompt (~1.5k tokens) prefills in one step")
    smallest = min(host.gpus, key=lambda g: (g.memory_mib, g.compute_capability))
    if smallest.memory_mib >= 70 * 1024 and smallest.compute_capability >= (9, 0):
        return Choice(
            8192,
            f"{smallest.name} (Hopper or later, >= 70 GiB): vLLM's server default there, about five "
            "RAG prompts' prefill beside the decodes",
        )
    return Choice(2048, f"{smallest.name}: vLLM's server default below Hopper-class GPUs")


def kv_block_size(host: Host) -> Choice:
    """Tokens per KV-cache block. The prefix cache reuses whole blocks only, so the prompt's fixed
    part is laid out in whole blocks of this size (workers/generation/prompt.py reads it)."""
    if host.gpus:
        # Forcing a size a CUDA attention backend does not take excludes that backend; 16 is
        # vLLM's own default, which FlashAttention and FlashInfer both take.
        return Choice(16, "a GPU: vLLM's default block, which its CUDA attention backends take")
    return Choice(128, "a CPU: vLLM's CPU attention default (its kernels take multiples of 32)")


def enforce_eager(host: Host) -> Choice:
    if host.gpus:
        return Choice(False, "a GPU: CUDA graphs for decode steps (eager launches each kernel from Python)")
    return Choice(False, "torch.compile: several times eager's throughput, for a slower first start")


def enable_prefix_caching(host: Host) -> Choice:
    return Choice(True, "RAG prompts share their instructions' blocks, and repeated sources theirs")


def enable_chunked_prefill(host: Host) -> Choice:
    return Choice(True, "a long prompt's prefill is cut into chunks beside the decodes, not stalling them")


def free_gpu(host: Host) -> int | None:
    """The position (torch's cuda:n) of the first visible GPU nothing holds, or None."""
    return next(
        (n for n, g in enumerate(host.gpus) if g.known and g.used_mib < FREE_GPU_USED_MIB),
        None,
    )


def ingest_encoder_device(host: Host) -> Choice:
    if not host.gpus:
        return Choice("cpu", "no GPU visible")
    n = free_gpu(host)
    if n is None:
        return Choice("cpu", "every visible GPU is in use (an engine holds its memory)")
    # Passages are long (~200 words) and come in batches: the case a GPU serves best. How much
    # faster than the host's cores is to be measured on a GPU host (docs/performance.md).
    return Choice(f"cuda:{n}", f"{host.gpus[n].describe()} is visible and free: passages batch well there")


def query_encoder_device(host: Host) -> Choice:
    # A query is ~13 tokens: on a GPU its encode is mostly the copy there and back, and it would
    # share the device with the engine. Not yet measured against a GPU (docs/performance.md).
    return Choice("cpu", "queries are short: no copy to a GPU, which stays the engine's")


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
