"""One vLLM ``AsyncLLM`` per process, on its own event loop, shared by every task thread.

Each Celery task thread submits into the same engine, so all requests in flight advance in
the same engine steps (continuous batching) instead of waiting for one another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ragline.broker.config.settings import GenerationSettings
from ragline.workers.errors import WorkerError
from ragline.workers.generation.engine_protocol import Engine

log = logging.getLogger(__name__)


class EngineUnavailable(WorkerError, RuntimeError):
    """The engine died or is shutting down; the request should go back to the queue."""


class GenerationTimeout(WorkerError, TimeoutError):
    """The request did not finish in its time budget; it was aborted in the engine."""


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    completion_tokens: int
    prompt_tokens: int
    finished: bool
    finish_reason: str | None
    # Prompt tokens whose KV state the engine found in its prefix cache.
    cached_tokens: int = 0


_END = object()
_CORE_EXIT_S = 2.0  # how long the engine core may take to exit on shutdown before vLLM kills it


def configure_cpu_env(settings: GenerationSettings) -> None:
    """vLLM's CPU backend reads these from the environment when the engine starts."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kvcache_space_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", settings.cpu_omp_threads_bind)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def engine_args(s: GenerationSettings, model_path: str) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    optional: dict[str, Any] = {}
    if s.quantization:
        optional["quantization"] = s.quantization
    if s.speculative_config:
        optional["speculative_config"] = json.loads(s.speculative_config)
    return AsyncEngineArgs(
        model=model_path,
        dtype=s.dtype,
        enforce_eager=s.enforce_eager,
        max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        enable_chunked_prefill=s.enable_chunked_prefill,
        enable_prefix_caching=s.enable_prefix_caching,
        # Passed, not left to vLLM, so that the prompt's layout and the engine's blocks agree.
        block_size=s.kv_block_size,
        gpu_memory_utilization=s.gpu_memory_utilization,
        tensor_parallel_size=s.tensor_parallel,
        load_format=s.load_format,
        disable_log_stats=False,
        seed=0,
        **optional,
    )


def sampling_params(
    s: GenerationSettings, *, max_tokens: int, temperature: float | None = None, stop: tuple[str, ...] = ()
) -> Any:
    """One request's sampling, deltas streamed: the settings' unless the request sets its own
    ``temperature`` (None: the setting's) and ``stop``."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(s.min_new_tokens, max_tokens),
        temperature=s.temperature if temperature is None else temperature,
        frequency_penalty=s.frequency_penalty,
        stop=list(stop) or None,
        output_kind=RequestOutputKind.DELTA,
    )


class EngineHost(Engine):
    def __init__(self, settings: GenerationSettings, model_path: str) -> None:
        self._settings = settings
        self._model_path = model_path
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._engine: Any = None
        self._stopping = False
        self._lock = threading.Lock()
        self._open: set[queue.Queue[Any]] = set()  # the output queue of each stream in flight

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self, *, timeout_s: float = 900.0) -> None:
        configure_cpu_env(self._settings)
        self._thread.start()
        # The engine's output handler attaches to the loop it is built on: build it there.
        self._engine = asyncio.run_coroutine_threadsafe(self._build(), self._loop).result(timeout_s)
        # The engine may still change the block size (a model whose attention needs another).
        blocks = self._engine.vllm_config.cache_config.block_size
        if blocks != self._settings.kv_block_size:
            log.warning(
                "the engine uses KV blocks of %d tokens, not kv_block_size %d",
                blocks,
                self._settings.kv_block_size,
            )
        log.info("vLLM engine ready: %s, KV blocks of %d tokens", self._model_path, blocks)

    async def _build(self) -> Any:
        from ragline.workers.generation.engine_stats import PrometheusStats
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(
            engine_args(self._settings, self._model_path), stat_loggers=[PrometheusStats]
        )

    def prefix_block_tokens(self) -> int:
        """The tokens of one KV block the prefix cache reuses (1: it reuses none), as the engine
        resolved it: vLLM's CPU backend uses 128, a GPU 16 unless its attention backend differs."""
        if self._engine is None:
            raise EngineUnavailable("engine is not running")
        cache = self._engine.vllm_config.cache_config
        if not cache.enable_prefix_caching:
            return 1
        return int(cache.cache_hit_alignment_tokens or cache.block_size)

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
        """Generate from a worker thread, yielding text deltas as the engine produces them;
        ``temperature`` None is the setting's, and the answer ends before any of ``stop``.

        ``prompt`` is token ids (a built prompt's, workers/generation/prompt.py), used as they
        are; text is tokenized with its special tokens recognised, so only trusted text
        (benchmarks, tests) is passed as text."""
        if self._engine is None or self._stopping:
            raise EngineUnavailable("engine is not running")
        params = sampling_params(self._settings, max_tokens=max_tokens, temperature=temperature, stop=stop)
        out_q: queue.Queue[Any] = queue.Queue()
        with self._lock:
            self._open.add(out_q)
            if self._stopping:  # hand_back() ran since the check above
                out_q.put(EngineUnavailable("the worker is shutting down"))
        future = asyncio.run_coroutine_threadsafe(self._pump(request_id, prompt, params, out_q), self._loop)
        deadline = time.monotonic() + timeout_s
        finished = False
        try:
            # Ends at the last delta, not at _END: a hand_back() in between must not requeue it.
            while not finished:
                try:
                    item = out_q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise GenerationTimeout(f"generation exceeded {timeout_s:.0f}s") from None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            with self._lock:
                self._open.discard(out_q)
            if not finished:
                # Cancelling the coroutine aborts the request inside the engine.
                self._cancel(future)

    def _cancel(self, future: Future[None]) -> None:
        self._loop.call_soon_threadsafe(future.cancel)

    async def _pump(
        self, request_id: str, prompt: Sequence[int] | str, params: Any, out_q: queue.Queue[Any]
    ) -> None:
        from vllm.inputs import TextPrompt, TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        completion_tokens = 0
        try:
            # Rendered here, as vLLM asks of its callers (a raw prompt is deprecated); ids are
            # taken as they are, never detokenized and tokenized again.
            raw = (
                TextPrompt(prompt=prompt)
                if isinstance(prompt, str)
                else TokensPrompt(prompt_token_ids=list(prompt))
            )
            (engine_input,) = self._engine.renderer.render_cmpl([raw])
            async for output in self._engine.generate(engine_input, params, request_id):
                piece = output.outputs[0]
                completion_tokens += len(piece.token_ids)
                out_q.put(
                    Delta(
                        text=piece.text,
                        completion_tokens=completion_tokens,
                        prompt_tokens=len(output.prompt_token_ids or ()),
                        finished=output.finished,
                        finish_reason=piece.finish_reason,
                        cached_tokens=output.num_cached_tokens or 0,
                    )
                )
        except EngineDeadError as exc:
            out_q.put(EngineUnavailable(str(exc)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out_q.put(exc)
        finally:
            out_q.put(_END)

    def hand_back(self) -> None:
        """Refuse new requests and end every one in flight with EngineUnavailable, which its task
        turns into a requeue: a stopping worker hands its work back at once instead of holding
        its shutdown for whole generations, longer than a supervisor's grace on a CPU host.
        Safe from a signal handler on a thread that never streams (it only puts on queues)."""
        with self._lock:
            self._stopping = True
            for out_q in self._open:
                out_q.put(EngineUnavailable("the worker is shutting down"))

    def shutdown(self) -> None:
        """Stop the engine and its core process; without this SIGTERM hangs the worker."""
        self.hand_back()
        if self._engine is not None:
            engine = self._engine
            self._engine = None

            async def _stop() -> None:
                # Nothing of the core's needs saving once its requests are handed back: a short
                # wait before vLLM kills it (its default is longer) keeps the worker's exit
                # inside the supervisor's grace.
                engine.shutdown(timeout=_CORE_EXIT_S)

            try:
                asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
            except Exception:
                log.exception("engine shutdown failed")
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
