"""The client's own bodies against the server's: field for field, so that the light client
(``ragline[client]``: httpx and pydantic, no server) reads and writes what the API does. Runs
where the server is installed too."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import to_jsonable_python
from ragline.api.documents import protocol as documents
from ragline.api.indexes import protocol as indexes
from ragline.api.jobs import protocol as jobs
from ragline.api.query import protocol as query
from ragline.broker.contract import messages

from ragline.client import JobOptions, QueryOptions, events
from ragline.client import protocol as client

# Each client model and the server's model it mirrors.
PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (client.QueryRequest, query.QueryRequest),
    (client.JobRequest, jobs.JobRequest),
    (client.Done, messages.Done),
    (client.QueryResponse, query.QueryResponse),
    (client.StreamDone, query.StreamDone),
    (client.Sources, messages.Sources),
    (client.Token, messages.Token),
    (client.Restart, messages.Restart),
    (client.Error, messages.Error),
    (client.JobAccepted, jobs.JobAccepted),
    (client.JobView, jobs.JobView),
    (client.IndexList, indexes.IndexList),
    (client.IndexDetail, indexes.IndexDetail),
    (client.DocumentList, documents.DocumentList),
]

# What a schema says about a field's meaning for people, not its shape on the wire.
_PROSE = frozenset({"description", "title", "additionalProperties"})


def _shape(schema: Any) -> Any:
    """A JSON schema without its prose: the fields, their types, defaults and which are required."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in _PROSE}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


@pytest.mark.parametrize(("mine", "theirs"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_the_client_model_has_the_servers_fields(mine: type[BaseModel], theirs: type[BaseModel]) -> None:
    assert list(mine.model_fields) == list(theirs.model_fields)
    for name, field in mine.model_fields.items():
        other = theirs.model_fields[name]
        assert field.is_required() == other.is_required(), name
        if not field.is_required():
            default, their_default = (f.get_default(call_default_factory=True) for f in (field, other))
            assert to_jsonable_python(default) == to_jsonable_python(their_default), name
    # Nested models included (they have the server's names, so their $refs match too).
    assert _shape(mine.model_json_schema()) == _shape(theirs.model_json_schema())


def test_requests_refuse_what_the_server_refuses_and_responses_ignore_what_they_do_not_know() -> None:
    with pytest.raises(ValueError, match="top_kk"):
        client.QueryRequest(query="q", top_kk=3)  # type: ignore[call-arg]
    done = client.StreamDone.model_validate({"answer": "a", "request_id": "r", "added_later": 1})
    assert done.answer == "a"


def test_a_servers_answer_decodes_as_the_clients() -> None:
    server = query.QueryResponse(
        answer="It declares names global.",
        request_id="r1",
        sources=[messages.Source(chunk_id="c", source="ref.md", title="T", text="x", score=0.5)],
        citations=[messages.Citation(marker=1, chunk_id="c", source="ref.md", title="T")],
        usage=messages.Usage(prompt_tokens=3, completion_tokens=4),
    )
    mine = client.QueryResponse.model_validate_json(server.model_dump_json())
    assert mine.model_dump() == server.model_dump()


def test_the_options_name_every_request_field() -> None:
    asked = set(query.QueryRequest.model_fields) - {"query", "abort_on_disconnect"}
    assert set(typing.get_type_hints(QueryOptions)) == asked
    job_fields = set(jobs.JobRequest.model_fields) - {"query", "abort_on_disconnect"}
    assert set(typing.get_type_hints(JobOptions)) == job_fields


def test_the_client_knows_every_event_the_server_sends() -> None:
    samples: dict[str, BaseModel] = {
        "sources": messages.Sources(sources=[]),
        "token": messages.Token(text="a"),
        "restart": messages.Restart(),
        "done": query.StreamDone(answer=None, request_id="r"),
        "error": messages.Error(status=500, message="failed"),
    }
    assert set(samples) == {model.type for model in typing.get_args(messages.StreamEvent)}
    for name, payload in samples.items():
        event = events.decode_event(name, payload.model_dump_json(), "1-0")
        assert event is not None and event.event_id == "1-0", name
        assert event.model_dump(exclude={"event_id"}) == payload.model_dump(), name
