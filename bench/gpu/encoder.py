"""The encoder for ingest on a GPU against the CPU: passages per second, same model, same passages.

    python -m bench.gpu.encoder --model DIR [--passages 4096] [--seconds 20]

Whether an ingest worker should embed on a visible GPU (``RAGLINE_INGEST_ENCODER_DEVICE``) is a
measurement, not a guess: this encodes the same passages (~200 words each, cut from this
repository's own docs, so it needs no corpus) with all-MiniLM-L6-v2 on every CPU core this process
may use, then on the GPU in float32 and in float16, at the batch size ingest uses and a larger one.
Each configuration runs for about ``--seconds`` after a warm-up. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

WORDS_PER_PASSAGE = 200
BATCHES = (64, 256)


def passages(count: int) -> list[str]:
    """``count`` passages of ~200 words, from the docs beside this file, repeated in turn with a
    number so that none is a cache hit of another."""
    root = Path(__file__).resolve().parents[2]
    words = " ".join(p.read_text() for p in sorted((root / "docs").rglob("*.md"))).split()
    chunks = [" ".join(words[i : i + WORDS_PER_PASSAGE]) for i in range(0, len(words), WORDS_PER_PASSAGE)]
    return [f"{n} {chunks[n % len(chunks)]}" for n in range(count)]


def rate(model: Any, texts: list[str], batch: int, seconds: float) -> float:
    """Passages per second over whole passes of ``texts``, after one warm-up batch."""
    model.encode(texts[:batch], batch_size=batch)
    done, started = 0, time.perf_counter()
    while True:
        model.encode(texts, batch_size=batch)
        done += len(texts)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return done / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a sentence-transformers folder")
    parser.add_argument("--passages", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    texts = passages(args.passages)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    figures: dict[str, Any] = {"passages": len(texts), "cpu_cores": cores}
    cpu = SentenceTransformer(str(args.model), device="cpu").float()
    for batch in BATCHES:
        figures[f"cpu_fp32_b{batch}_per_s"] = round(rate(cpu, texts, batch, args.seconds), 1)
        print(f"cpu fp32 batch {batch}: {figures[f'cpu_fp32_b{batch}_per_s']} passages/s", flush=True)
    if torch.cuda.is_available():
        figures["gpu"] = torch.cuda.get_device_name(0)
        for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
            gpu = SentenceTransformer(str(args.model), device="cuda").to(dtype)
            for batch in BATCHES:
                key = f"gpu_{name}_b{batch}_per_s"
                figures[key] = round(rate(gpu, texts, batch, args.seconds), 1)
                print(f"gpu {name} batch {batch}: {figures[key]} passages/s", flush=True)
            del gpu
            torch.cuda.empty_cache()
        best_cpu = max(v for k, v in figures.items() if k.startswith("cpu_") and k.endswith("_per_s"))
        figures["gpu_fp32_b64_over_cpu"] = round(figures["gpu_fp32_b64_per_s"] / best_cpu, 2)
        figures["gpu_fp16_b256_over_cpu"] = round(figures["gpu_fp16_b256_per_s"] / best_cpu, 2)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
