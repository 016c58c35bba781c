"""The whole path on real parts: API -> Celery -> MiniLM + FAISS -> vLLM -> event stream."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
import redis
from ragline.broker.state.result_cache import _LOOKUP

from tests.helpers import commands_seen, parse_sse, pushed_queues

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_rag_query_answers_from_the_planted_fact_and_cites_it(
    client: httpx.Client, workers, redis_url: str
) -> None:
    with pushed_queues(redis_url) as pushed:
        reply = client.post(
            "/v1/query", json={"query": "When does Café Lumière open in the morning?", "top_k": 3}
        )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert "7:15" in body["answer"], body["answer"]
    assert any("Café Lumière opens at 7:15" in s["text"] for s in body["sources"])
    assert body["sources"][0]["source"].endswith("cafe.md")
    assert body["degraded"] is False
    t = body["timings"]
    assert t["total_ms"] >= t["generation_ms"] > 0 and t["retrieval_ms"] > 0
    assert body["usage"]["completion_tokens"] > 0
    assert reply.headers["X-Request-Id"] == body["request_id"]
    assert "retrieval" in pushed and "generation" in pushed


def test_retrieval_mode_never_touches_the_generation_queue(
    client: httpx.Client, workers, redis_url: str
) -> None:
    with pushed_queues(redis_url) as pushed:
        reply = client.post(
            "/v1/query", json={"query": "How long may I borrow library books?", "mode": "retrieval"}
        )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["answer"] is None
    assert body["sources"][0]["source"].endswith("library.rst")
    assert body["timings"]["generation_ms"] == 0
    assert "retrieval" in pushed
    assert "generation" not in pushed


def test_stream_sends_sources_then_tokens_then_done(api, workers) -> None:
    events = []
    with (
        httpx.Client(base_url=api.base, timeout=180) as c,
        c.stream("POST", "/v1/query/stream", json={"query": "What speciality does Café Lumière bake?"}) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(parse_sse(r.iter_lines()))
    kinds = [e[1] for e in events]
    assert kinds[0] == "sources"
    assert kinds[-1] == "done"
    # The writer batches the tokens each round brings: a loaded box can bring a short answer in
    # one round (the resume tests read streams part-way through).
    assert kinds.count("token") >= 1
    assert all(e[0] for e in events), "every event carries an SSE id"
    done = events[-1][2]
    streamed = "".join(e[2]["text"] for e in events if e[1] == "token")
    assert done["answer"] == streamed  # byte for byte: a client that joins the tokens has the answer
    assert done["usage"]["completion_tokens"] > 0
    assert {"queue_ms", "retrieval_ms", "generation_ms", "total_ms"} <= done["timings"].keys()


def test_stream_resumes_after_last_event_id(api, workers) -> None:
    with httpx.Client(base_url=api.base, timeout=180) as c:
        with c.stream(
            "POST", "/v1/query/stream", json={"query": "Which platform does the coast train use?"}
        ) as r:
            request_id = r.headers["X-Request-Id"]
            first = list(parse_sse(r.iter_lines()))
        cut = first[1][0]  # resume after the second event
        with c.stream("GET", f"/v1/query/stream/{request_id}", headers={"Last-Event-ID": cut}) as r:
            resumed = list(parse_sse(r.iter_lines()))
    assert [e[0] for e in resumed] == [e[0] for e in first[2:]]


def test_concurrent_queries_all_answer(client: httpx.Client, workers) -> None:
    import concurrent.futures as cf

    questions = [
        "When does Café Lumière close?",
        "How often should I oil a bicycle chain?",
        "At what temperature should green tea be brewed?",
        "When is the library closed?",
    ]
    with cf.ThreadPoolExecutor(len(questions)) as pool:
        replies = list(pool.map(lambda q: client.post("/v1/query", json={"query": q}), questions))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert all(r.json()["answer"] for r in replies)


def test_identical_concurrent_queries_are_computed_once(
    client: httpx.Client, workers, redis_url: str
) -> None:
    import concurrent.futures as cf

    question = "What is the house speciality at Café Lumière?"
    variants = [question, question.upper(), f"  {question} ", "what is the house speciality at café lumière"]
    with pushed_queues(redis_url) as pushed, cf.ThreadPoolExecutor(len(variants)) as pool:
        replies = list(pool.map(lambda q: client.post("/v1/query", json={"query": q}), variants))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert len({r.json()["answer"] for r in replies}) == 1
    assert len({r.json()["request_id"] for r in replies}) == len(variants)
    assert pushed.count("generation") == 1  # one generation for all four


def test_cache_hit_touches_no_queue(client: httpx.Client, workers, redis_url: str) -> None:
    body = {"query": "Is the Vellmar library open on Mondays?", "mode": "retrieval"}
    first = client.post("/v1/query", json=body)
    assert first.status_code == 200 and first.json()["cached"] is False
    with pushed_queues(redis_url) as pushed:
        again = client.post("/v1/query", json={**body, "query": "is the vellmar library open on mondays"})
    assert again.status_code == 200, again.text
    hit = again.json()
    assert hit["cached"] is True and hit["request_id"] != first.json()["request_id"]
    assert hit["sources"] == first.json()["sources"]
    assert pushed == []


def test_cache_hit_path_keeps_the_request_id_and_every_check(client: httpx.Client, workers) -> None:
    body = {"query": "When does the Vellmar library close?", "mode": "retrieval"}
    assert client.post("/v1/query", json=body).status_code == 200
    hit = client.post("/v1/query", json=body)
    assert hit.status_code == 200 and hit.json()["cached"] is True
    assert hit.headers["X-Request-Id"] == hit.json()["request_id"]
    assert hit.headers["content-type"] == "application/json"
    # A cached answer does not excuse a bad request: each of these is refused as without a cache.
    assert client.post("/v1/query", json={**body, "top_k": 0}).status_code == 422
    assert client.post("/v1/query", json={**body, "surprise": 1}).status_code == 422
    assert client.post("/v1/query", json=body, headers={"X-Request-Deadline-Ms": "0"}).status_code == 422
    assert (
        client.post(
            "/v1/query", content=b'{"query": ', headers={"Content-Type": "application/json"}
        ).status_code
        == 400
    )
    as_text = client.post("/v1/query", content=json.dumps(body), headers={"Content-Type": "text/plain"})
    assert as_text.status_code == 415  # the route reads only JSON bodies, and so does the fast path
    with_deadline = client.post("/v1/query", json=body, headers={"X-Request-Deadline-Ms": "5000"})
    assert with_deadline.status_code == 200 and with_deadline.json()["cached"] is True
    metrics = client.get("/metrics").text
    assert 'ragline_requests_total{endpoint="/v1/query",status="200"}' in metrics.replace(", ", ",")


def test_a_cold_query_is_looked_up_once(client: httpx.Client, workers, redis_url: str) -> None:
    lookup = hashlib.sha1(_LOOKUP.encode()).hexdigest()
    with commands_seen(redis_url) as seen:
        body = {"query": "Who founded the Vellmar library?", "mode": "retrieval"}
        reply = client.post("/v1/query", json=body)
    assert reply.status_code == 200 and reply.json()["cached"] is False
    assert sum(lookup in c for c in seen) == 1  # one lookup, by the fast path, which then answers


def test_disconnect_aborts_generation(api, workers, redis_url: str) -> None:
    # How fast the abort lands is the machine's business (a benchmark's, not a test's); that it
    # lands long before the answer could have finished is the behaviour.
    import time

    from ragline.broker.redis.keys import Keys

    client = redis.Redis.from_url(redis_url)
    body = {"query": "Tell me everything about Café Lumière, its buns, its terrace and its hours."}
    with (
        httpx.Client(base_url=api.base, timeout=180) as c,
        c.stream("POST", "/v1/query/stream", json=body) as r,
    ):
        request_id = r.headers["X-Request-Id"]
        for line in r.iter_lines():
            if line == "event: token":
                break
    # the connection is closed here, mid-answer
    closed = time.monotonic()
    key = Keys(workers.settings.redis.key_prefix).events(request_id)
    while True:
        last = client.xrevrange(key, count=1)
        if last and last[0][1][b"type"] in (b"error", b"done"):
            break
        assert time.monotonic() - closed < 5, "generation went on after the client left"
        time.sleep(0.05)
    assert last[0][1][b"type"] == b"error", last  # aborted, not finished


def test_a_query_s_filter_and_retrieval_mode_reach_the_worker(client: httpx.Client) -> None:
    ask = {"query": "When does the library open?", "mode": "retrieval", "top_k": 3}
    only_tea = client.post("/v1/query", json={**ask, "filter": {"path": "tea.md"}})
    assert only_tea.status_code == 200, only_tea.text
    sources = only_tea.json()["sources"]
    assert sources and all(s["source"].endswith("tea.md") for s in sources), sources
    # The filter is part of the cache key: the same query unfiltered is a different answer.
    unfiltered = client.post("/v1/query", json=ask).json()
    assert unfiltered["cached"] is False and unfiltered["sources"][0]["source"].endswith("library.rst")
    lexical = client.post("/v1/query", json={**ask, "retrieval": "lexical", "diversity": False})
    assert lexical.status_code == 200 and lexical.json()["cached"] is False
    assert client.post("/v1/query", json={**ask, "retrieval": "sparse"}).status_code == 422
