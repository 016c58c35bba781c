"""Which of vLLM's dependencies ragline's engine path imports: the measurement behind the ``gpu``
table of ragline/bundle_left_out.toml.

Run it with the Python of an environment that has ragline[gpu] installed (on a host with or
without a GPU: the CUDA build of torch imports without one):

    VENV/bin/python deploy/vllm_engine_imports.py [--engine-core] [--json OUT]

It imports what ragline's generation worker imports from vLLM (the AsyncLLM front end, the
engine arguments, sampling parameters, the stat logger, the CPU plugin's hooks, the tokenizer)
and, with --engine-core, the modules the engine's core process loads for a dense model on a GPU
(the engine core, the GPU worker and model runner, the Llama model, the FlashAttention backend),
then maps every module that came in to its distribution and prints, for each of vLLM's declared
dependencies, whether anything of it was imported. What a running engine imports lazily (a
kernel library picked at its first step, say) is not seen here: start an engine for that.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import sys
import time

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

FRONT_END = [
    "ragline.workers.generation.engine",
    "ragline.workers.generation.engine_stats",
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.async_llm",
    "vllm.sampling_params",
    "vllm.v1.engine.exceptions",
    "vllm.v1.metrics.loggers",
    "vllm.platforms",
    "vllm.distributed.device_communicators.shm_broadcast",
    "transformers",
]
ENGINE_CORE = [
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama",
    "vllm.v1.attention.backends.flash_attn",
]


def _import_all(names: list[str]) -> dict[str, str]:
    failures = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a module that cannot load here is reported, not fatal
            failures[name] = f"{type(exc).__name__}: {exc}"
    return failures


def _distributions_of(modules: set[str]) -> dict[str, int]:
    by_top = md.packages_distributions()
    counts: dict[str, int] = {}
    for module in modules:
        for dist in by_top.get(module.split(".")[0], []):
            key = canonicalize_name(dist)
            counts[key] = counts.get(key, 0) + 1
    return counts


def _requirements(dist: str) -> list[Requirement]:
    env = default_environment()
    wanted = []
    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            wanted.append(req)
    return wanted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-core", action="store_true", help="also the engine core's GPU modules")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()

    before = set(sys.modules)
    started = time.perf_counter()
    failures = _import_all(FRONT_END + (ENGINE_CORE if args.engine_core else []))
    seconds = time.perf_counter() - started
    imported = _distributions_of(set(sys.modules) - before)

    rows = []
    for req in _requirements("vllm"):
        name = canonicalize_name(req.name)
        rows.append({"name": name, "imported": name in imported, "modules": imported.get(name, 0)})
    result = {
        "vllm": md.version("vllm"),
        "torch": md.version("torch"),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "engine_core": args.engine_core,
        "import_seconds": round(seconds, 1),
        "failed_imports": failures,
        "imported_distributions": dict(sorted(imported.items())),
        "vllm_requirements": rows,
    }
    for row in rows:
        used = f"imported ({row['modules']} modules)" if row["imported"] else "-"
        print(f"{row['name']:<45} {used}")
    for module, error in failures.items():
        print(f"could not import {module}: {error}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
