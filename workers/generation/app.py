"""The generation worker: ``celery -A ragline.workers.generation.app:app worker -Q generation -P threads``.

One engine per process; the threads pool is sized to ``max_num_seqs`` so that many tasks are
in the engine at once and it batches them.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import closing

from ragline.broker import metrics
from ragline.broker.config.settings import get_settings
from ragline.broker.contract.messages import Done, Error, GenerateTask, Restart, Token, Usage
from ragline.broker.contract.queues import GENERATE_TASK, GENERATION_QUEUE
from ragline.broker.limits.backpressure import Occupancy
from ragline.broker.redis.durability import Replication
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import jobs
from ragline.broker.streams.event_batcher import EventBatcher
from ragline.broker.streams.events import EventWriter
from ragline.workers.bootstrap import bootstrap
from ragline.workers.finished_streams import finished_ttl
from ragline.workers.generation.answer_text import AnswerText
from ragline.workers.generation.citations import MarkerRenumbering, citations
from ragline.workers.generation.engine import EngineHost, EngineUnavailable, GenerationTimeout
from ragline.workers.generation.engine_protocol import Engine
from ragline.workers.generation.hf_engine import TransformersEngine
from ragline.workers.generation.model_prep import generation_model_path
from ragline.workers.generation.prompt import PromptBuilder, build_rag_prompt
from ragline.workers.hooked_task import hooked_task
from ragline.workers.hooks import Cancellation, QueueWait, RequestEvents, RequeueOn, TrackJob
from ragline.workers.task_call import TaskCall
from ragline.workers.tracing import Served, Traced, generation_phases

log = logging.getLogger(__name__)
settings = get_settings()
generation = settings.generation
# Each task reports how many ran at once beside it: a batching engine's time per task depends on it.
occupancy = Occupancy(generation.max_num_seqs).track(GENERATE_TASK)

_engine: Engine | None = None
_prompts: PromptBuilder | None = None
_batcher: EventBatcher | None = None


def _start_engine() -> None:
    """Build the engine before the worker consumes, so readiness means able to generate.

    An engine that cannot start (no model, say) ends the process: Celery only logs what a
    worker_init receiver raises and consumes anyway, so the worker would hand back every task it
    took, in a loop, while its heartbeat said it was live."""
    global _engine, _prompts, _batcher
    try:
        from transformers import AutoTokenizer

        _batcher = EventBatcher(
            sync_client(settings.redis),
            keys,
            ttl_s=settings.redis.event_stream_ttl_s,
            maxlen=settings.redis.event_stream_maxlen,
        )

        model_path = generation_model_path(settings)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        engine: Engine = (
            TransformersEngine(generation, model_path)
            if generation.engine == "transformers"
            else EngineHost(generation, model_path)
        )
        _engine = engine
        engine.start()
        # Prompts padded to the blocks this engine's prefix cache reuses.
        _prompts = PromptBuilder(tokenizer, block_tokens=engine.prefix_block_tokens())
    except Exception:
        log.critical("the generation engine did not start: exiting before consuming", exc_info=True)
        logging.shutdown()
        os._exit(1)


def _hand_back() -> None:
    """On SIGTERM/SIGINT, before the pool waits for its tasks: each generation in flight ends
    with EngineUnavailable and its task is requeued now, so nothing accepted waits on this
    worker's exit (a generation can outlast any supervisor's grace on a CPU host)."""
    if isinstance(_engine, EngineHost):
        _engine.hand_back()


def _stop_engine() -> None:
    if _engine is not None:
        _engine.shutdown()
    if _batcher is not None:
        _batcher.close()


worker = bootstrap(
    GENERATION_QUEUE,
    settings,
    init=[_start_engine],
    stopping=[_hand_back],
    shutdown=[_stop_engine],
    # One engine per GPU on a host: which one this is (ragline/placement.py).
    labels={"gpu": generation.engine_gpus} if generation.engine_gpus else None,
)
app, keys = worker.app, worker.keys


def _request_events(call: TaskCall[GenerateTask]) -> RequestEvents:
    client = sync_client(settings.redis)
    request_id = call.payload.request_id
    writer = EventWriter(
        client,
        keys,
        request_id,
        ttl_s=settings.redis.event_stream_ttl_s,
        maxlen=settings.redis.event_stream_maxlen,
        job=jobs.tracker(client, keys, settings.jobs, call.payload.job_id, Replication.of(settings.redis)),
        batch=_batcher.stream(request_id) if _batcher is not None else None,
        flush_timeout_s=2 * settings.redis.redis_socket_timeout_s + 1,
        occupancy=occupancy,
        finished_ttl=finished_ttl(),
    )
    return RequestEvents(writer, queue=GENERATION_QUEUE, picked_at=call.picked_at)


events = TrackJob("generating", _request_events, failed="generation")
cancellation = Cancellation(events)


@hooked_task(
    app,
    GENERATE_TASK,
    GenerateTask,
    [
        QueueWait(GENERATION_QUEUE, lambda call: [call.payload.enqueued_at]),
        events,
        cancellation,
        # The engine died under us (e.g. Ctrl-C reached its process first) or the worker is
        # stopping: the task goes back to the queue.
        RequeueOn(EngineUnavailable),
        # Last: its span sees the body's own error, before the hooks above deal with it.
        Traced(
            "ragline.generate",
            lambda call: [Served(call.payload.request_id, call.payload.enqueued_at)],
            queue_wait="ragline.generation.queue_wait",
        ),
    ],
)
def generate(call: TaskCall[GenerateTask]) -> None:
    """One request's answer (:class:`~ragline.broker.contract.messages.GenerateTask`)."""
    task = call.payload
    writer = events.tracked(call).writer
    if writer.has_partial_answer():
        writer.emit(Restart())
    if _engine is None or _prompts is None:
        raise EngineUnavailable("engine not started")
    queue_ms = task.timings.queue_ms + max(0.0, (call.picked_at - task.enqueued_at) * 1000)
    sampling = task.sampling
    max_tokens = sampling.max_tokens or generation.max_new_tokens
    prompt = build_rag_prompt(
        generation, _prompts, task.query, task.sources, history=task.history, max_tokens=max_tokens
    )
    started = time.perf_counter()
    # The answer's [n] as the client numbers the sources (the prompt orders them for its cache).
    markers = MarkerRenumbering(prompt.renumbering)
    answer_text = AnswerText()
    first_token_ms: float | None = None

    def send(delta: str) -> None:
        nonlocal first_token_ms
        if text := answer_text.feed(delta):
            if first_token_ms is None:
                first_token_ms = (time.perf_counter() - started) * 1000
                metrics.TTFT_SECONDS.observe(first_token_ms / 1000)
            writer.emit(Token(text=text))

    completion_tokens = 0
    finish_reason: str | None = None
    stream = _engine.stream(
        task.request_id,
        prompt.token_ids,
        max_tokens=max_tokens,
        timeout_s=generation.generation_timeout_s,
        temperature=sampling.temperature,
        stop=sampling.stop,
    )
    try:
        with closing(stream):  # closed early (a cancel, an error), it aborts the request in the engine
            for delta in stream:
                cancellation.check(call)
                completion_tokens = delta.completion_tokens
                finish_reason = delta.finish_reason or finish_reason
                send(markers.feed(delta.text))
            send(markers.flush())  # a "[" still open when the model stopped is text
    except GenerationTimeout as exc:
        writer.emit(
            Error(status=504, message=str(exc)),
            completes=GENERATION_QUEUE,
            service_s=time.time() - call.picked_at,
        )
        return
    generation_ms = (time.perf_counter() - started) * 1000
    metrics.GENERATION_SECONDS.observe(generation_ms / 1000)
    metrics.GENERATED_TOKENS.inc(completion_tokens)
    generation_phases(
        started, first_token_ms, generation_ms, prompt_tokens=prompt.prompt_tokens, tokens=completion_tokens
    )
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
        citations=citations(answer, prompt.by_given_number),
        finish_reason="length" if finish_reason == "length" else "stop",
        partial=bool(task.partial_shards),
        partial_shards=list(task.partial_shards),
    )
    writer.emit(
        done,
        completes=GENERATION_QUEUE,
        service_s=time.time() - call.picked_at,
    )
