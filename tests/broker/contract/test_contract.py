"""The typed contract: every payload and event survives its trip, and anything else is refused."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from ragline.api.jobs.protocol import JobResult
from ragline.api.query.protocol import QueryResponse, StreamDone
from ragline.broker.contract.messages import (
    Cancelled,
    ChatTurn,
    Citation,
    ContractError,
    Degradation,
    Done,
    Error,
    GenerateTask,
    Restart,
    RetrieveRequest,
    RetrieveTask,
    Sampling,
    SemanticMatch,
    Source,
    Sources,
    StreamEvent,
    Timings,
    Token,
    Usage,
    WebhookDelivery,
    decode_event,
)
from ragline.broker.contract.records import JobRecord, JobView
from ragline.broker.contract.requests import JobRequest
from ragline.broker.state import jobs

SOURCE = Source(
    chunk_id="cafe.md#0", source="/docs/cafe.md", title="Café Lumière", text="Opens 7:15.", score=0.8
)
# Every field away from its default, so that a field lost on the way cannot pass for one kept.
DONE = Done(
    answer="At 7:15.",
    usage=Usage(prompt_tokens=412, completion_tokens=9),
    timings=Timings(
        queue_ms=1.5,
        retrieval_ms=12.25,
        generation_ms=801.0,
        first_token_ms=95.5,
        total_ms=830.0,
        predicted_wait_ms=640.0,
    ),
    sources_dropped=2,
    early_exit=True,
    degraded=True,
    degraded_reason="generation_busy",
    notice="sources only",
    cached="semantic",
    semantic_match=SemanticMatch(question="When does the café open?", similarity=0.97),
    citations=[Citation(marker=1, chunk_id="cafe.md#0", source="/docs/cafe.md", title="Café Lumière")],
    finish_reason="length",
    partial=True,
    partial_shards=["docs.shard-2"],
)


def _through_celery(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the worker's task receives: the kwargs through Celery's JSON serializer."""
    return json.loads(json.dumps(kwargs))


def test_done_sample_sets_every_field() -> None:
    for name, field in Done.model_fields.items():
        assert getattr(DONE, name) != field.get_default(call_default_factory=True), name
    for name, field in Timings.model_fields.items():
        assert getattr(DONE.timings, name) != field.get_default(), name


@pytest.mark.parametrize(
    "task",
    [
        RetrieveTask(
            requests=[
                RetrieveRequest(
                    request_id="r1",
                    query="When does Café Lumière open?",
                    top_k=3,
                    mode="retrieval",
                    index="test",
                    index_version="v2",
                    ef_search=64,
                    nprobe=4,
                    allow_early_exit=False,
                    enqueued_at=time.time(),
                    job_id="r1",
                    degraded=Degradation(degraded_reason="generation_busy", notice="busy"),
                    history=(
                        ChatTurn(role="user", content="Hi"),
                        ChatTurn(role="assistant", content="Hello"),
                    ),
                    sampling=Sampling(max_tokens=32, temperature=0.7, stop=("\n\n", "END")),
                ),
                RetrieveRequest(
                    request_id="r2", query="q", top_k=5, mode="rag", index="test", enqueued_at=1.0
                ),
            ]
        ),
        GenerateTask(
            request_id="r1",
            query="When?",
            sources=[SOURCE],
            timings=Timings(queue_ms=2.0, retrieval_ms=10.0),
            enqueued_at=time.time(),
            job_id=None,
            history=(ChatTurn(role="user", content="Hi"),),
            sampling=Sampling(max_tokens=16, temperature=0.0, stop=("END",)),
        ),
        WebhookDelivery(job_id="j1", attempt=3),
    ],
)
def test_task_payloads_round_trip_through_celery_kwargs(
    task: RetrieveTask | GenerateTask | WebhookDelivery,
) -> None:
    kwargs = task.encode()
    assert _through_celery(kwargs) == kwargs  # JSON types only
    assert type(task).decode(_through_celery(kwargs)) == task


def test_tasks_queued_by_the_previous_release_still_decode() -> None:
    """The kwargs as the API and the retrieval worker wrote them before the contract."""
    retrieve = {
        "requests": [
            {
                "request_id": "r1",
                "query": "q",
                "top_k": 5,
                "mode": "rag",
                "index": "test",
                "index_version": "v1",
                "ef_search": None,
                "nprobe": None,
                "allow_early_exit": True,
                "enqueued_at": 1.0,
            }
        ]
    }
    assert RetrieveTask.decode(retrieve).requests[0].job_id is None
    generate = {
        "request_id": "r1",
        "query": "q",
        "sources": [SOURCE.model_dump()],
        "timings": {"queue_ms": 1.0, "retrieval_ms": 2.0},
        "enqueued_at": 1.0,
        "job_id": None,
    }
    assert GenerateTask.decode(generate).sources == [SOURCE]
    assert WebhookDelivery.decode({"job_id": "j", "attempt": 1}).attempt == 1


@pytest.mark.parametrize(
    ("model", "kwargs", "needle"),
    [
        (WebhookDelivery, {"job_id": "j"}, "attempt: Field required"),
        (
            WebhookDelivery,
            {"job_id": "j", "attempt": 0},
            "attempt: Input should be greater than or equal to 1",
        ),
        (WebhookDelivery, {"job_id": "j", "attempt": 1, "priority": 9}, "priority: Extra inputs"),
        (
            GenerateTask,
            {"request_id": "r", "query": "q", "sources": [{"chunk_id": "c"}], "enqueued_at": 1},
            "sources.0",
        ),
        (RetrieveTask, {"requests": [{"request_id": "r"}]}, "requests.0.query"),
        (RetrieveTask, {"requests": "r1"}, "requests: Input should be a valid list"),
    ],
)
def test_a_bad_task_payload_is_refused_with_what_is_wrong(model: type, kwargs: dict, needle: str) -> None:
    with pytest.raises(ContractError, match=model.__name__) as refused:
        model.decode(kwargs)
    assert needle in str(refused.value)


@pytest.mark.parametrize(
    "event",
    [
        Sources(sources=[SOURCE], index_version="v3"),
        Sources(sources=[]),
        Token(text=" 7:15"),
        Restart(),
        DONE,
        Done(answer=None),
        Error(status=404, message="unknown index 'x'"),
        Cancelled(),
    ],
)
def test_events_round_trip_through_a_stream_entry(event: StreamEvent) -> None:
    entry = {b"type": event.type.encode(), b"data": event.encode().encode()}  # as XRANGE returns it
    decoded = decode_event(entry[b"type"], entry[b"data"])
    assert decoded == event and type(decoded) is type(event)


def test_the_wire_is_what_clients_always_saw() -> None:
    assert Cancelled().type == "error"
    assert json.loads(Cancelled().encode()) == {"status": 499, "message": "cancelled"}
    assert isinstance(decode_event("error", '{"status":499,"message":"cancelled"}'), Cancelled)
    assert isinstance(decode_event("error", '{"status":500,"message":"x"}'), Error)
    assert json.loads(Token(text="a").encode()) == {"text": "a"}
    assert json.loads(Sources(sources=[SOURCE]).encode())["sources"] == [SOURCE.model_dump()]
    # A `done` the previous release's generation worker wrote.
    old = {
        "answer": "At 7:15.",
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
        "sources_dropped": 1,
        "timings": {"queue_ms": 1.0, "retrieval_ms": 2.0, "generation_ms": 3.0, "first_token_ms": 0.5},
    }
    done = decode_event("done", json.dumps(old))
    assert isinstance(done, Done) and done.sources_dropped == 1 and done.timings.first_token_ms == 0.5


@pytest.mark.parametrize(
    ("type_", "data", "needle"),
    [
        ("progress", "{}", "unknown event type 'progress'"),
        ("token", "{}", "malformed token event: text: Field required"),
        ("token", '{"text": "a", "logprob": -1}', "logprob: Extra inputs are not permitted"),
        ("done", '{"answer": "a", "early_exit": "maybe"}', "early_exit"),
        ("error", '{"status": "bad", "message": "x"}', "status"),
        ("sources", "not json", "malformed sources event"),
    ],
)
def test_a_bad_event_is_refused_with_what_is_wrong(type_: str, data: str, needle: str) -> None:
    with pytest.raises(ContractError) as refused:
        decode_event(type_, data)
    assert needle in str(refused.value)


@pytest.mark.parametrize("model", [QueryResponse, StreamDone, JobResult])
def test_every_answer_the_api_gives_carries_every_done_field(model: type[Done]) -> None:
    extra = {"request_id": "rid", "sources": [SOURCE]}
    built = model.from_done(DONE, **{k: v for k, v in extra.items() if k in model.model_fields})
    assert built.done_fields() == DONE.done_fields()
    body = json.loads(built.model_dump_json())
    assert {k: body[k] for k in Done.model_fields} == json.loads(DONE.encode())


def test_a_job_record_shows_every_done_field() -> None:
    now = time.time()
    queued = jobs.new_record(
        job_id="j1",
        owner="alice",
        request=JobRequest(query="q", top_k=1, mode="rag", index="test"),
        now=now,
    )
    stored = {
        **queued.encode(),
        "status": "done",
        "done_at": repr(now + 2.0),
        "result": DONE.encode(),
        "sources": json.dumps([SOURCE.model_dump()]),
    }
    view = JobView.of(JobRecord.decode(stored))
    result = view.model_dump(mode="json")["result"]
    assert result["sources"] == [SOURCE.model_dump()]
    expected = json.loads(DONE.encode())
    # The job's total is its own: from creation to done.
    assert result["timings"].pop("total_ms") == pytest.approx(2000.0)
    expected["timings"].pop("total_ms")
    assert {k: result[k] for k in Done.model_fields} == expected
    assert isinstance(view.result, JobResult) and view.result.early_exit is True


def test_an_unreadable_job_record_says_so() -> None:
    record = {
        "id": "j1",
        "owner": "alice",
        "created_at": "1.0",
        "updated_at": "1.0",
        "status": "done",
        "request": '{"query": "q", "top_k": 1, "mode": "rag", "index": "i"}',
    }
    assert JobRecord.decode(record).status == "done"
    with pytest.raises(ContractError, match="colour"):
        JobRecord.decode({**record, "result": '{"answer": "a", "colour": "red"}'})
    with pytest.raises(ContractError, match=r"malformed job record: sources.0.source: Field required"):
        JobRecord.decode({**record, "result": '{"answer": "a"}', "sources": '[{"chunk_id": "c"}]'})
