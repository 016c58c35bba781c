"""Where the generation engines run: one engine per GPU, or one per ``tensor_parallel`` GPUs.

``ragline worker generation --gpus all|0,1`` and ``ragline up`` start one generation worker
process per :class:`Placement`, each pinned to its GPUs by ``CUDA_VISIBLE_DEVICES`` (so its
engine, and the settings it chooses from the device, see only those), all consuming the one
generation queue. On a host without GPUs there is one placement, on the CPU. This module only
decides; ``ragline/processes.py`` starts the processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragline.broker.config.gpus import Gpu


class PlacementError(ValueError):
    """The GPUs asked for are not there, or do not divide into engines."""


@dataclass(frozen=True, slots=True)
class Placement:
    """One engine's GPUs, as nvidia-smi numbers them; none: the engine runs on the CPU."""

    gpus: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """The GPUs as the engine's metrics and heartbeat name them ("2", "0,1"; "" on the CPU)."""
        return ",".join(map(str, self.gpus))

    @property
    def name(self) -> str:
        """The worker process's name under a supervisor (and in its Celery node name)."""
        return "generation-worker" + ("-gpu" + "-".join(map(str, self.gpus)) if self.gpus else "")

    def environment(self) -> dict[str, str]:
        """What the engine's process adds to its environment."""
        if not self.gpus:
            return {}
        return {
            "CUDA_VISIBLE_DEVICES": self.label,
            # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi (and --gpus) by
            # PCI bus: the same order makes "2" the same GPU for both.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "RAGLINE_ENGINE_GPUS": self.label,
        }


def parse_gpus(spec: str) -> tuple[int, ...] | None:
    """``all`` (None) or a list of nvidia-smi indices such as ``0,1``."""
    text = spec.strip().lower()
    if text == "all":
        return None
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise PlacementError(f"--gpus takes `all` or GPU indices such as `0,1`, not {spec!r}")
        if int(part) in indices:
            raise PlacementError(f"--gpus {spec}: GPU {part} is listed twice")
        indices.append(int(part))
    return tuple(indices)


def place_engines(spec: str, available: Sequence[Gpu], tensor_parallel: int = 1) -> list[Placement]:
    """The engines to start for ``spec`` (``--gpus`` / RAGLINE_GPUS) on the GPUs this process may
    use, ``tensor_parallel`` GPUs each (RAGLINE_TENSOR_PARALLEL), in the order given."""
    asked = parse_gpus(spec)
    here = [g.index for g in available]
    if asked is None:
        chosen = here
    else:
        if not here:
            raise PlacementError(
                f"--gpus {spec}: no GPU is visible here "
                "(nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)"
            )
        missing = [i for i in asked if i not in here]
        if missing:
            raise PlacementError(
                f"--gpus {spec}: no GPU {', '.join(map(str, missing))} here "
                f"(this process may use {', '.join(map(str, here))})"
            )
        chosen = list(asked)
    if not chosen:
        if tensor_parallel > 1:
            raise PlacementError(
                f"RAGLINE_TENSOR_PARALLEL={tensor_parallel} spreads one engine over GPUs, and none is visible"
            )
        return [Placement()]
    if len(chosen) % tensor_parallel:
        raise PlacementError(
            f"{len(chosen)} GPUs ({', '.join(map(str, chosen))}) do not divide into engines of "
            f"RAGLINE_TENSOR_PARALLEL={tensor_parallel}: name the GPUs with --gpus"
        )
    return [Placement(tuple(chosen[i : i + tensor_parallel])) for i in range(0, len(chosen), tensor_parallel)]


def spare_gpus(available: Sequence[Gpu], placements: Sequence[Placement]) -> tuple[int, ...]:
    """The GPUs no engine is placed on (an ingest encoder may take one)."""
    taken = {i for p in placements for i in p.gpus}
    return tuple(g.index for g in available if g.index not in taken)
