"""The OpenAI-compatible endpoint's parts without a stack: the chat body read as the pipeline's
query, OpenAI's error shape, and the chunks a stream's events become (restart, whitespace, and
resume after any chunk). tests/api/chat/test_chat_completions.py drives the same on real parts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ragline.api.chat.protocol import ChatCompletionRequest, query_request, request_id_of, version_created
from ragline.api.chat.render import ChunkStream, chat_stream, completion_of
from ragline.api.errors import ApiError, error_response, invalid
from ragline.api.pipeline import Query, QueryContext
from ragline.api.pipeline.validate import parse_body, query_of
from ragline.api.query.protocol import QueryResponse
from ragline.broker.config.settings import ApiSettings, Settings
from ragline.broker.contract.messages import Done, Error, Restart, Source, Sources, Timings, Token, Usage
from ragline.broker.streams.events import Event

SETTINGS = Settings().replace(default_index="docs", max_new_tokens=64, max_history_turns=3)
SOURCE = Source(chunk_id="c1", source="cafe.md", title="Café", text="Opens at 7:15.", score=0.9)


def chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return parse_body(json.dumps(body).encode(), ChatCompletionRequest, "application/json")


def query_of_chat(req: ChatCompletionRequest) -> Query:
    return query_of(query_request(req), SETTINGS.api, SETTINGS.retrieval, SETTINGS.generation)


def messages(*turns: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in turns]


# -- the request -----------------------------------------------------------------------------------


def test_the_last_message_is_the_query_and_earlier_turns_its_history() -> None:
    req = chat(
        {
            "model": "docs",
            "messages": messages(
                ("system", "Be brief."),
                ("user", "Hi"),
                ("assistant", "Hello! [1]"),
                (
                    "user",
                    [{"type": "text", "text": "When does the "}, {"type": "text", "text": "café open?"}],
                ),
            ),
            "max_tokens": 500,
            "temperature": 0.5,
            "stop": "\n\n",
            "user": "alice",
            # OpenAI fields ragline does not use, and one no OpenAI release has: all ignored.
            "presence_penalty": 0.1,
            "logit_bias": {"50256": -100},
            "stream_options": {"include_usage": True},
            "seed": 7,
            "something_new": [1, 2],
        }
    )
    q = query_of_chat(req)
    assert q.query == "When does the café open?" and q.index == "docs" and q.mode == "rag"
    assert [(t.role, t.content) for t in q.history] == [("user", "Hi"), ("assistant", "Hello! [1]")]
    # max_tokens is capped at the server's; the server's defaults are named, for the cache key.
    assert (q.sampling.max_tokens, q.sampling.temperature, q.sampling.stop) == (64, 0.5, ("\n\n",))
    plain = query_of_chat(chat({"model": "docs", "messages": messages(("user", "q?"))}))
    assert (plain.sampling.max_tokens, plain.sampling.temperature, plain.history) == (64, 0.0, ())


def test_only_the_most_recent_turns_are_kept() -> None:
    turns = [("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(8)]
    req = chat({"model": "docs", "messages": messages(*turns, ("user", "last?"))})
    q = query_of_chat(req)
    assert [t.content for t in q.history] == ["turn 5", "turn 6", "turn 7"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": 3, "messages": messages(("user", "q"))}, "model"),
        ({"model": "docs", "messages": "q"}, "messages"),
        ({"model": "docs", "messages": []}, "messages"),
        ({"model": "docs", "messages": messages(("robot", "q"))}, "messages"),
        ({"model": "docs", "messages": messages(("user", 5))}, "messages"),
        ({"model": "docs", "messages": messages(("user", "q")), "stream": "yes"}, "stream"),
        ({"model": "docs", "messages": messages(("user", "q")), "max_tokens": "10"}, "max_tokens"),
        ({"model": "docs", "messages": messages(("user", "q")), "temperature": "hot"}, "temperature"),
        ({"model": "docs", "messages": messages(("user", "q")), "stop": [1]}, "stop"),
        ({"messages": messages(("user", "q"))}, "model"),
    ],
)
def test_a_wrong_type_is_400_in_openai_s_shape_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat(body)
    reply = error_response(caught.value, "r1", path="/v1/chat/completions")
    error = json.loads(reply.body)["error"]
    assert reply.status_code == 400
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"model": "docs", "messages": messages(("user", "q"), ("assistant", "a"))}, "messages", "last"),
        ({"model": "docs", "messages": messages(("user", "q")), "n": 2}, "n", "n=1"),
        ({"model": "", "messages": messages(("user", "q"))}, "model", "index"),
        (
            {"model": "docs", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
            "text",
        ),
    ],
)
def test_a_conversation_it_cannot_answer_is_400(body: dict[str, Any], param: str, needle: str) -> None:
    with pytest.raises(ApiError) as caught:
        query_request(chat(body))
    assert (caught.value.status, caught.value.param) == (400, param) and needle in caught.value.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": list("abcde")}, "stop"),
    ],
)
def test_sampling_out_of_the_server_s_bounds_is_refused(extra: dict[str, Any], param: str) -> None:
    req = chat({"model": "docs", "messages": messages(("user", "q")), **extra})
    with pytest.raises(ApiError) as caught:
        query_of_chat(req)
    assert caught.value.param == param
    assert error_response(caught.value, None, path="/v1/chat/completions").status_code == 400


def test_other_paths_keep_the_api_s_own_error_shape() -> None:
    error = invalid([{"loc": ("body", "top_k"), "msg": "bad", "type": "int_type"}])
    reply = error_response(error, "r1", path="/v1/query")
    assert reply.status_code == 422
    assert json.loads(reply.body) == {"error": "invalid_request", "message": "top_k: bad", "request_id": "r1"}


def test_ids_and_versions() -> None:
    assert request_id_of("chatcmpl-abc") == request_id_of("abc") == "abc"
    assert version_created("20260101T000000000000Z-abcdef") == 1767225600
    assert version_created("v1") == 0


# -- the response ----------------------------------------------------------------------------------


def _done(answer: str | None, **fields: Any) -> Done:
    usage = Usage(prompt_tokens=10, completion_tokens=4) if answer else None
    return Done(answer=answer, usage=usage, timings=Timings(generation_ms=3.0), **fields)


def test_a_completion_carries_the_answer_usage_and_the_ragline_object() -> None:
    response = QueryResponse.from_done(
        _done("At 7:15 [1].", finish_reason="length"), request_id="r1", sources=[SOURCE]
    )
    body = completion_of(response, model="docs", created=5).model_dump(mode="json")
    assert body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion" and body["model"] == "docs"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "At 7:15 [1]."},
            "finish_reason": "length",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    ragline = body["ragline"]
    assert ragline["sources"][0]["chunk_id"] == "c1" and ragline["degraded"] is False
    assert ragline["timings"]["generation_ms"] == 3.0 and ragline["request_id"] == "r1"


def test_a_degraded_answer_is_a_normal_completion_that_says_so() -> None:
    done = _done(None, degraded=True, degraded_reason="generation_busy", notice="Generation is busy.")
    response = QueryResponse.from_done(done, request_id="r1", sources=[SOURCE])
    body = completion_of(response, model="docs", created=5).model_dump(mode="json")
    content = body["choices"][0]["message"]["content"]
    assert content.startswith("Generation is busy.") and "[1] Café (cafe.md)" in content
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["ragline"]["degraded"] is True and body["usage"]["total_tokens"] == 0


def test_a_partial_answer_says_so_in_the_ragline_object() -> None:
    """A sharded index's shards that did not answer: the completion, the stream's first chunk (its
    sources) and its last chunk each say which."""
    done = _done("At 7:15 [1].", partial=True, partial_shards=["docs.shard-2"])
    response = QueryResponse.from_done(done, request_id="r1", sources=[SOURCE])
    ragline = completion_of(response, model="docs", created=5).model_dump(mode="json")["ragline"]
    assert ragline["partial"] is True and ragline["partial_shards"] == ["docs.shard-2"]
    sources = Sources(sources=[SOURCE], index="docs", partial=True, partial_shards=["docs.shard-2"])
    chunks = _chunks(_events(sources, Token(text="At 7:15 [1]."), done))
    for chunk in (chunks[0], chunks[-1]):
        assert chunk["ragline"]["partial"] is True and chunk["ragline"]["partial_shards"] == ["docs.shard-2"]
    # What OpenAI's own fields carry is not repeated in it.
    assert not {"answer", "usage", "finish_reason"} & (ragline.keys() | chunks[-1]["ragline"].keys())


# -- the stream ------------------------------------------------------------------------------------


def _events(*payloads: Any) -> list[Event]:
    return [Event(f"1700000000000-{i}", p) for i, p in enumerate(payloads)]


def _joined(chunks: list[dict[str, Any]]) -> str:
    """What a client that honours ragline.restart joins."""
    text = ""
    for chunk in chunks:
        if (chunk.get("ragline") or {}).get("restart"):
            text = ""
        text += chunk["choices"][0]["delta"].get("content") or ""
    return text


def _chunks(events: list[Event]) -> list[dict[str, Any]]:
    stream = ChunkStream("r1", model="docs")
    return [json.loads(data) for e in events if (data := stream.feed(e)) is not None]


def test_chunks_join_to_the_answer_with_whitespace_held_back() -> None:
    tokens = ["\n ", "It", " opens", " ", " at", " 7:15", " [1].", "\n"]
    answer = "".join(tokens).strip()  # as the generation worker makes done.answer
    events = _events(Sources(sources=[SOURCE], index="docs"), *(Token(text=t) for t in tokens), _done(answer))
    chunks = _chunks(events)
    first, last = chunks[0], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["ragline"]["sources"][0]["chunk_id"] == "c1" and first["created"] == 1700000000
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"]["total_tokens"] == 14
    assert "sources" not in last["ragline"] and last["ragline"]["timings"]["generation_ms"] == 3.0
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-r1" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == answer
    assert not any(c["ragline"].get("restart") for c in chunks if "ragline" in c)


def test_a_redelivered_generation_that_regenerates_the_same_text_sends_nothing_twice() -> None:
    answer = "It opens at 7:15."
    events = _events(
        Sources(sources=[SOURCE]),
        Token(text="It"),
        Token(text=" opens"),
        Restart(),
        Token(text="It"),
        Token(text=" opens"),
        Token(text=" at 7:15."),
        _done(answer),
    )
    chunks = _chunks(events)
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents == ["", "It", " opens", " at 7:15.", None]
    assert not any((c.get("ragline") or {}).get("restart") for c in chunks)


def test_a_redelivered_generation_that_departs_restarts_the_content() -> None:
    events = _events(
        Sources(sources=[SOURCE]),
        Token(text="It closes"),
        Restart(),
        Token(text="It opens"),
        _done("It opens"),
    )
    chunks = _chunks(events)
    assert (
        chunks[2]["ragline"]["restart"] is True and chunks[2]["choices"][0]["delta"]["content"] == "It opens"
    )
    assert _joined(chunks) == "It opens"


def test_an_answer_without_tokens_arrives_in_the_final_chunk() -> None:
    done = _done(None, degraded=True, notice="Generation is busy.")
    chunks = _chunks(_events(Sources(sources=[SOURCE]), done))
    assert chunks[-1]["choices"][0]["delta"]["content"].startswith("Generation is busy.")
    assert chunks[-1]["ragline"]["degraded"] is True


def test_a_worker_error_is_openai_s_error_object() -> None:
    chunks = _chunks(_events(Error(status=404, message="unknown index 'x'")))
    assert chunks == [
        {
            "error": {
                "message": "unknown index 'x'",
                "type": "invalid_request_error",
                "param": None,
                "code": "unknown_index",
            }
        }
    ]


class _Relaying:
    """What a live stream asks of the pipeline: its events after an id (and its pacing)."""

    settings = ApiSettings()

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    async def relay(self, ctx: Any, *, after: str = "0-0") -> AsyncIterator[Event]:
        for event in self.events:
            yield event


def _sse(pipeline: Any, after: str) -> list[tuple[str, str]]:
    async def collect() -> list[bytes]:
        ctx = QueryContext("r1", request=None, query=None, deadline_s=1.0, source_id="r1")
        return [f async for f in chat_stream(pipeline, ctx, model="docs", after=after)]

    frames = []
    for raw in asyncio.run(collect()):
        lines = raw.decode().strip().split("\n")
        assert lines[0].startswith("id: r1:") and lines[1].startswith("data: "), lines
        frames.append((lines[0][4:], lines[1][6:]))
    return frames


def test_a_stream_resumed_after_any_chunk_sends_the_rest_exactly() -> None:
    events = _events(
        Sources(sources=[SOURCE], index="docs"),
        *(Token(text=t) for t in ["It", " opens", " ", "at", " 7:15."]),
        _done("It opens at 7:15."),
    )
    pipeline = _Relaying(events)
    whole = _sse(pipeline, "0-0")
    assert whole[-1][1] == "[DONE]" and whole[-1][0] == whole[-2][0]
    for cut in range(len(whole) - 1):
        after = whole[cut][0].split(":", 1)[1]
        assert _sse(pipeline, after) == whole[cut + 1 :], cut
