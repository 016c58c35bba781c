"""The OpenAI-compatible endpoint driven by the real ``openai`` client against the real stack (API,
Celery, MiniLM + FAISS, vLLM): sync, async, streaming, a dropped stream resumed, errors in
OpenAI's shape, and the same keys and admission as /v1/query."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from ragline.broker.config.settings import Settings

from tests.helpers import Api, api_key, parse_sse, planted_load, pushed_queues

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

MODEL = "test"  # the session's index


def _client(api: Api, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=api.base + "/v1", api_key=key, max_retries=0, timeout=180)


def _chunks(lines: list[str]) -> list[tuple[str, str]]:
    """(id, data) of each SSE event of a chat stream."""
    events, event_id = [], None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            events.append((event_id, line[6:]))
    return events


def _done_answer(api: Api, request_id: str, headers: dict[str, str] | None = None) -> str:
    """The request's final answer, from its own event stream (the owner may read it again)."""
    reply = httpx.get(api.base + f"/v1/query/stream/{request_id}", headers=headers or {}, timeout=180)
    [done] = [data for _, event, data in parse_sse(iter(reply.text.splitlines())) if event == "done"]
    return done["answer"]


def _stable(events: list[tuple[str, str]]) -> list[tuple[str, object]]:
    """The events as each connection sends them: all the same but what the API adds to the
    final chunk's timings, which are the connection's own (its total, admission's prediction)."""
    out: list[tuple[str, object]] = []
    for event_id, data in events:
        chunk = data if data == "[DONE]" else json.loads(data)
        if isinstance(chunk, dict) and "timings" in (chunk.get("ragline") or {}):
            chunk["ragline"]["timings"].pop("total_ms")
            chunk["ragline"]["timings"].pop("predicted_wait_ms", None)
        out.append((event_id, chunk))
    return out


def _content(events: list[tuple[str, str]]) -> str:
    return "".join(
        json.loads(data)["choices"][0]["delta"].get("content") or "" for _, data in events if data != "[DONE]"
    )


def test_a_completion_answers_from_the_index_and_carries_its_sources(api: Api, workers) -> None:
    client = _client(api)
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "When does Café Lumière open in the morning?"},
        ],
        user="alice",
    )
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert completion.id.startswith("chatcmpl-")
    [choice] = completion.choices
    assert choice.message.content and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    ragline = completion.model_extra["ragline"]
    assert ragline["sources"][0]["source"].endswith("cafe.md") and ragline["degraded"] is False
    assert (
        ragline["timings"]["generation_ms"] > 0 and ragline["request_id"] == completion.id[len("chatcmpl-") :]
    )
    # The same question through /v1/query: the same pipeline, so the same answer (its cache).
    same = httpx.post(
        api.base + "/v1/query", json={"query": "When does Café Lumière open in the morning?"}, timeout=180
    ).json()
    assert same["answer"] == choice.message.content and same["cached"] is True
    metrics = httpx.get(api.base + "/metrics", timeout=10).text
    assert 'ragline_request_seconds_count{endpoint="/v1/chat/completions",mode="rag"}' in metrics


def test_sampling_reaches_the_engine(api: Api, workers) -> None:
    reply = _client(api).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Café Lumière's house speciality in detail."}],
        max_tokens=3,
        temperature=0,
        stop=["\n\n"],
    )
    assert reply.usage.completion_tokens <= 3 and reply.choices[0].finish_reason == "length"


def test_the_async_client_and_earlier_turns(api: Api, workers) -> None:
    async def ask() -> openai.types.chat.ChatCompletion:
        async with openai.AsyncOpenAI(base_url=api.base + "/v1", api_key="unused", max_retries=0) as client:
            return await client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "user", "content": "I am planning a trip to Vellmar."},
                    {"role": "assistant", "content": "Vellmar has a library and a coast train."},
                    {"role": "user", "content": "Which platform does the coast train use?"},
                ],
                timeout=180,
            )

    completion = asyncio.run(ask())
    assert completion.choices[0].message.content
    assert completion.model_extra["ragline"]["sources"]


def test_a_stream_is_chunks_that_join_to_the_answer(api: Api, workers) -> None:
    question = "What speciality does Café Lumière bake?"
    stream = _client(api).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], stream=True
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["ragline"]["sources"]
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length") and final.usage.completion_tokens > 0
    joined = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len([c for c in chunks if c.choices[0].delta.content]) >= 2
    assert joined == _done_answer(api, final.id[len("chatcmpl-") :])


def test_a_dropped_stream_resumes_after_its_last_event_with_no_gap_and_no_duplicate(
    api: Api, workers
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "How often should I oil a bicycle chain, and why?"}],
        "stream": True,
    }
    with httpx.Client(base_url=api.base, timeout=180) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            request_id = r.headers["X-Request-Id"]
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if len(_chunks(lines)) == 3:
                    break  # the connection drops here
        first = _chunks(lines)
        assert all(event_id and event_id.startswith(request_id + ":") for event_id, _ in first)
        with c.stream(
            "GET",
            f"/v1/chat/completions/chatcmpl-{request_id}/stream",
            headers={"Last-Event-ID": first[-1][0]},
        ) as r:
            assert r.status_code == 200
            rest = _chunks(list(r.iter_lines()))
        # The same POST with the header resumes too, from any chunk.
        with c.stream("POST", "/v1/chat/completions", json=body, headers={"Last-Event-ID": first[0][0]}) as r:
            again = _chunks(list(r.iter_lines()))
        whole = c.get(f"/v1/chat/completions/{request_id}/stream")
    assert rest[-1][1] == "[DONE]" and again[-1][1] == "[DONE]"
    ids = [event_id for event_id, data in first + rest if data != "[DONE]"]
    assert len(ids) == len(set(ids)), "no chunk twice"
    assert _stable(first[1:] + rest) == _stable(again)
    assert _stable(_chunks(whole.text.splitlines())) == _stable(first + rest), "no gap"
    final = json.loads(rest[-2][1])
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert _content(first + rest) == _done_answer(api, request_id)


def test_wrong_types_are_400_and_unknown_fields_are_ignored(api: Api, workers) -> None:
    client = _client(api)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "When does the library close?"}],
            temperature="hot",  # type: ignore[arg-type]
        )
    assert bad.value.status_code == 400 and bad.value.param == "temperature"
    assert bad.value.type == "invalid_request_error"
    raw = httpx.post(api.base + "/v1/chat/completions", json={"model": MODEL, "messages": "hi"}, timeout=10)
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-index", messages=[{"role": "user", "content": "q?"}])
    assert unknown.value.code == "model_not_found" and unknown.value.param == "model"
    ignored = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "When does the library close?"}],
        presence_penalty=0.5,
        seed=3,
        extra_body={"something_new": {"a": 1}},
    )
    assert ignored.choices[0].message.content
    # The rest of the API keeps its own shape.
    other = httpx.post(api.base + "/v1/query", json={"query": ""}, timeout=10)
    assert other.status_code == 422 and other.json()["error"] == "invalid_request"


def test_models_are_the_indexes(api: Api, workers) -> None:
    models = _client(api).models.list()
    [card] = [m for m in models.data if m.id == MODEL]
    assert card.object == "model" and card.owned_by == "ragline" and card.created > 0
    assert card.model_extra["version"] and card.model_extra["documents"] >= 1
    index = httpx.get(api.base + f"/v1/indexes/{MODEL}", timeout=10).json()
    assert (
        card.model_extra["version"] == index["version"]
        and card.model_extra["documents"] == index["documents"]
    )
    with pytest.raises(openai.NotFoundError):
        _client(api).models.retrieve("no-such-index")


def test_keys_and_admission_are_the_query_pipeline_s(
    auth_apis: list[Api], workers, settings: Settings
) -> None:
    base = auth_apis[1]
    with pytest.raises(openai.AuthenticationError) as refused:
        _client(base, "not-a-key").models.list()
    assert refused.value.status_code == 401 and refused.value.type == "authentication_error"
    key, _ = api_key(settings)
    client = _client(base, key)
    question = "When does Café Lumière open? (chat, degraded)"
    with planted_load(settings, "generation"), pushed_queues(settings.redis.redis_url) as pushed:
        degraded = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}]
        )
        streamed = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": question + " streamed"}], stream=True
            )
        )
    content = degraded.choices[0].message.content
    assert content.startswith("Generation is busy") and "[1] " in content
    assert degraded.model_extra["ragline"]["degraded"] is True
    assert degraded.choices[0].finish_reason == "stop"
    assert streamed[-1].model_extra["ragline"]["degraded"] is True
    assert "".join(c.choices[0].delta.content or "" for c in streamed).startswith("Generation is busy")
    assert "generation" not in pushed
    # A stream is resumed by its owner only.
    other, _ = api_key(settings)
    stream = streamed[0].id
    own = httpx.get(
        base.base + f"/v1/chat/completions/{stream}/stream", headers={"X-API-Key": key}, timeout=30
    )
    assert own.status_code == 200 and own.text.rstrip().endswith("data: [DONE]")
    foreign = httpx.get(
        base.base + f"/v1/chat/completions/{stream}/stream", headers={"X-API-Key": other}, timeout=30
    )
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
