"""A transformers engine behind the same interface as the vLLM one, for hosts without vLLM.

It batches statically: requests that arrive together run as one ``generate`` call, grouped by
prompt-length bucket (<512, 512-1024, >1024 tokens) so a short prompt never pads to a long one.
A batch runs to its end before the next starts (no continuous batching): that is what vLLM adds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from ragline.broker.config import host
from ragline.broker.config.settings import GenerationSettings
from ragline.workers.generation.engine import Delta, EngineUnavailable, GenerationTimeout
from ragline.workers.generation.engine_protocol import Engine

log = logging.getLogger(__name__)

BUCKET_EDGES = (512, 1024)
_GATHER_S = 0.01  # how long the scheduler waits for company once a request arrives


def bucket_of(n_tokens: int) -> int:
    return sum(n_tokens >= edge for edge in BUCKET_EDGES)


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    result: Future[Delta] = field(default_factory=Future)


class TransformersEngine(Engine):
    def __init__(self, settings: GenerationSettings, model_path: str) -> None:
        self._settings = settings
        self._model_path = model_path
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
        self.tokenizer: Any = None
        self._model: Any = None

    def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # One thread per core the engine computes on, as vLLM's CPU backend binds them.
        torch.set_num_threads(host.cores_in(self._settings.cpu_omp_threads_bind))
        path = self._model_path
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = "auto" if self._settings.dtype == "auto" else getattr(torch, self._settings.dtype)
        self._model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        self._thread.start()

    def generate_batch(self, batch: list[list[int]], budgets: list[int]) -> list[tuple[str, int]]:
        """One padded ``generate`` call; returns (text, completion tokens) per prompt, each cut
        to its own token budget (the batch runs to the largest)."""
        import torch

        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        with torch.inference_mode():
            out = self._model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max(budgets),
                do_sample=False,
                pad_token_id=pad,
            )
        results = []
        for row, budget in zip(out[:, width:].tolist(), budgets, strict=True):
            row = row[:budget]
            if self.tokenizer.eos_token_id in row:
                row = row[: row.index(self.tokenizer.eos_token_id)]
            results.append((self.tokenizer.decode(row, skip_special_tokens=True), len(row)))
        return results

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending = [first]
            deadline = time.monotonic() + _GATHER_S
            while len(pending) < self._settings.max_num_seqs:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                pending.append(item)
            buckets: dict[int, list[_Request]] = {}
            for r in pending:
                if r.result.set_running_or_notify_cancel():
                    buckets.setdefault(bucket_of(len(r.prompt_ids)), []).append(r)
            for group in buckets.values():
                try:
                    outputs = self.generate_batch(
                        [r.prompt_ids for r in group], [r.max_tokens for r in group]
                    )
                except Exception as exc:
                    for r in group:
                        r.result.set_exception(exc)
                    continue
                for r, (text, n) in zip(group, outputs, strict=True):
                    ended = "length" if n >= r.max_tokens else "stop"
                    r.result.set_result(Delta(text, n, len(r.prompt_ids), True, ended))

    def prefix_block_tokens(self) -> int:
        """1: nothing of one request's KV state is kept for the next."""
        return 1

    def stream(
        self,
        request_id: str,
        prompt: Sequence[int] | str,
        *,
        max_tokens: int,
        timeout_s: float,
        temperature: float | None = None,
        stop: tuple[str, ...] = (),
    ) -> Generator[Delta, None, None]:  # close() aborts the request
        """The whole answer as one delta. It decodes greedily whatever the ``temperature`` (a
        batch shares one ``generate`` call); the answer is cut before the first of ``stop``.
        ``prompt`` is token ids, or trusted text (its special tokens recognised), as vLLM's."""
        if self._model is None:
            raise EngineUnavailable("engine is not running")
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = list(prompt)
        request = _Request(ids, max_tokens)
        self._queue.put(request)
        try:
            delta = request.result.result(timeout=timeout_s)
            cuts = [i for i in (delta.text.find(s) for s in stop) if i >= 0]
            if cuts:
                delta = replace(delta, text=delta.text[: min(cuts)], finish_reason="stop")
            yield delta
        except TimeoutError:
            raise GenerationTimeout(f"generation exceeded {timeout_s:.0f}s") from None
        finally:
            request.result.cancel()  # a request still queued is dropped

    def shutdown(self) -> None:
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(30)
