"""The generation worker: ``celery -A workers.generation.app:app worker -Q generation -P threads``.

One engine per process; the threads pool is sized to ``max_num_seqs`` so that many tasks are
in the engine at once and it batches them.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Task
from celery.exceptions import Reject
from celery.signals import worker_init, worker_shutdown, worker_shutting_down

from broker import jobs, metrics
from broker.backpressure import Occupancy
from broker.celery_app import create_celery
from broker.contract import Cancelled, ContractError, Done, Error, GenerateTask, Restart, Token, Usage
from broker.event_batcher import EventBatcher
from broker.events import EventWriter
from broker.keys import Keys
from broker.queues import GENERATE_TASK, GENERATION_QUEUE
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat, metrics_server
from workers.finished_streams import finished_ttl
from workers.generation.answer_text import AnswerText
from workers.generation.engine import EngineHost, EngineUnavailable, GenerationTimeout
from workers.generation.hf_engine import TransformersEngine
from workers.generation.model_prep import generation_model_path
from workers.generation.prompt import build_rag_prompt, citations

log = logging.getLogger(__name__)
settings = get_settings()
generation = settings.generation
keys = Keys(settings.redis.key_prefix)
app = create_celery(settings.redis)
metrics_server.install(settings.redis)
heartbeat.install(app, GENERATION_QUEUE, settings.redis, host_defaults=settings.host_defaults_line())
# Each task reports how many ran at once beside it: a batching engine's time per task depends on it.
occupancy = Occupancy(generation.max_num_seqs).track(GENERATE_TASK)

_engine: EngineHost | TransformersEngine | None = None
_tokenizer: Any = None
_batcher: EventBatcher | None = None


@worker_init.connect(weak=False)
def _start_engine(**_: object) -> None:
    """Build the engine before the worker consumes, so readiness means able to generate.

    An engine that cannot start (no model, say) ends the process: Celery only logs what a
    worker_init receiver raises and consumes anyway, so the worker would hand back every task it
    took, in a loop, while its heartbeat said it was live."""
    global _engine, _tokenizer, _batcher
    try:
        from transformers import AutoTokenizer

        _batcher = EventBatcher(
            sync_client(settings.redis),
            keys,
            ttl_s=settings.redis.event_stream_ttl_s,
            maxlen=settings.redis.event_stream_maxlen,
        )

        model_path = generation_model_path(settings)
        _tokenizer = AutoTokenizer.from_pretrained(model_path)
        engine = TransformersEngine if generation.engine == "transformers" else EngineHost
        _engine = engine(generation, model_path)
        _engine.start()
    except Exception:
        log.critical("the generation engine did not start: exiting before consuming", exc_info=True)
        logging.shutdown()
        os._exit(1)


@worker_shutting_down.connect(weak=False)
def _hand_back(**_: object) -> None:
    """On SIGTERM/SIGINT, before the pool waits for its tasks: each generation in flight ends
    with EngineUnavailable and its task is requeued now, so nothing accepted waits on this
    worker's exit (a generation can outlast any supervisor's grace on a CPU host)."""
    if isinstance(_engine, EngineHost):
        _engine.hand_back()


@worker_shutdown.connect(weak=False)
def _stop_engine(**_: object) -> None:
    if _engine is not None:
        _engine.shutdown()
    if _batcher is not None:
        _batcher.close()


@app.task(name=GENERATE_TASK, bind=True)
def generate(self: Task, **kwargs: Any) -> None:
    """One request's answer (:class:`~broker.contract.GenerateTask`)."""
    picked_at = time.time()
    try:
        task = GenerateTask.decode(kwargs)
    except ContractError as exc:
        # Acknowledged and dropped: a redelivery would fail the same way.
        log.error("rejected %s task %s: %s", GENERATE_TASK, self.request.id, exc)
        return
    request_id = task.request_id
    metrics.QUEUE_WAIT_SECONDS.labels(GENERATION_QUEUE).observe(max(0.0, picked_at - task.enqueued_at))
    client = sync_client(settings.redis)
    writer = EventWriter(
        client,
        keys,
        request_id,
        ttl_s=settings.redis.event_stream_ttl_s,
        maxlen=settings.redis.event_stream_maxlen,
        job=jobs.tracker(client, keys, settings.jobs, task.job_id),
        batch=_batcher.stream(request_id) if _batcher is not None else None,
        flush_timeout_s=2 * settings.redis.redis_socket_timeout_s + 1,
        occupancy=occupancy,
        finished_ttl=finished_ttl(),
    )
    if not writer.start("generating"):
        return
    if writer.has_partial_answer():
        writer.emit(Restart())
    if _engine is None:
        raise Reject("engine not started", requeue=True)
    queue_ms = task.timings.queue_ms + max(0.0, (picked_at - task.enqueued_at) * 1000)
    sampling = task.sampling
    max_tokens = sampling.max_tokens or generation.max_new_tokens
    prompt = build_rag_prompt(
        generation, _tokenizer, task.query, task.sources, history=task.history, max_tokens=max_tokens
    )
    started = time.perf_counter()
    answer_text = AnswerText()
    first_token_ms: float | None = None
    completion_tokens = 0
    finish_reason: str | None = None
    try:
        stream = _engine.stream(
            request_id,
            prompt.text,
            max_tokens=max_tokens,
            timeout_s=generation.generation_timeout_s,
            temperature=sampling.temperature,
            stop=sampling.stop,
        )
        for delta in stream:
            if writer.cancelled:
                stream.close()  # aborts the request in the engine
                writer.emit(Cancelled())
                return
            completion_tokens = delta.completion_tokens
            finish_reason = delta.finish_reason or finish_reason
            if text := answer_text.feed(delta.text):
                if first_token_ms is None:
                    first_token_ms = (time.perf_counter() - started) * 1000
                    metrics.TTFT_SECONDS.observe(first_token_ms / 1000)
                writer.emit(Token(text=text))
    except EngineUnavailable as exc:
        # The engine died under us (e.g. Ctrl-C reached its process first) or the worker is
        # stopping: give the task back.
        log.warning("engine unavailable for %s, requeueing: %s", request_id, exc)
        raise Reject(str(exc), requeue=True) from exc
    except GenerationTimeout as exc:
        writer.emit(
            Error(status=504, message=str(exc)),
            completes=GENERATION_QUEUE,
            service_s=time.time() - picked_at,
        )
        return
    except Exception as exc:
        log.exception("generation failed for %s", request_id)
        writer.emit(
            Error(status=500, message=f"generation failed: {exc}"),
            completes=GENERATION_QUEUE,
            service_s=time.time() - picked_at,
        )
        return
    generation_ms = (time.perf_counter() - started) * 1000
    metrics.GENERATION_SECONDS.observe(generation_ms / 1000)
    metrics.GENERATED_TOKENS.inc(completion_tokens)
    timings = task.timings.model_copy(
        update={
            "queue_ms": queue_ms,
            "generation_ms": generation_ms,
            "first_token_ms": first_token_ms or generation_ms,
        }
    )
    answer = answer_text.text
    done = Done(
        answer=answer,
        usage=Usage(prompt_tokens=prompt.prompt_tokens, completion_tokens=completion_tokens),
        sources_dropped=prompt.sources_dropped,
        timings=timings,
        citations=citations(answer, prompt.numbered),
        finish_reason="length" if finish_reason == "length" else "stop",
        partial=bool(task.partial_shards),
        partial_shards=list(task.partial_shards),
    )
    writer.emit(
        done,
        completes=GENERATION_QUEUE,
        service_s=time.time() - picked_at,
    )
