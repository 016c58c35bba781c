"""A real retrieval worker (Celery, MiniLM, FAISS) and API on a Redis database of their own: a
new index version is loaded beside the one served, never inside a batch, and one request that
fails does not fail the others of its batch.

The load is held open by the test, not timed: the new version's ``chunks.jsonl`` is a FIFO, so
the worker's loading thread blocks reading it until the test writes it. Everything answered
before that write was provably answered while the version loaded."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import RetrieveRequest, RetrieveTask
from ragline.broker.contract.queues import RETRIEVAL_QUEUE, RETRIEVE_TASK
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes

from tests.helpers import Stack, redis_db_after, stack_on_db

pytestmark = pytest.mark.integration

FERRY_V1 = "# Ferry\n\nThe island ferry departs at 08:40 from pier 3."
FERRY_V2 = "# Ferry\n\nFrom May the island ferry departs at 09:55 from pier 5."
LIGHTHOUSE = "# Lighthouse\n\nThe Vellmar lighthouse keeper paints the tower red every fourth summer."
FERRY_Q = "When does the island ferry depart?"
LIGHTHOUSE_Q = "Who paints the Vellmar lighthouse?"


@pytest.fixture(scope="module")
def stack(settings: Settings, embedder: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from ragline.workers.retrieval.ingest import ingest

    url = redis_db_after(settings.redis.redis_url, 3, "RAGLINE_TEST_ISOLATION_REDIS_URL")
    home = tmp_path_factory.mktemp("isolation-home")
    logs = tmp_path_factory.mktemp("isolation-logs")
    with stack_on_db(settings, url, ("retrieval",), logs, home=home, default_index="live") as running:
        for name, text in (("live", FERRY_V1), ("other", LIGHTHOUSE)):
            corpus = tmp_path_factory.mktemp(f"corpus-{name}")
            (corpus / f"{name}.md").write_text(text)
            ingest(running.settings, [corpus], index_name=name, embedder=embedder, progress=False)
        yield running


def _ask(stack: Stack, query: str, index: str) -> httpx.Response:
    body = {"query": query, "index": index, "mode": "retrieval", "top_k": 1}
    return httpx.post(f"{stack.base}/v1/query", json=body, timeout=60)


def _top(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    return str(reply.json()["sources"][0]["text"])


def _send_batch(stack: Stack, requests: list[RetrieveRequest]) -> None:
    app = create_celery(stack.settings.redis)
    app.send_task(RETRIEVE_TASK, kwargs=RetrieveTask(requests=requests).encode(), queue=RETRIEVAL_QUEUE)


def _request(index: str, query: str, version: str | None) -> RetrieveRequest:
    return RetrieveRequest(
        request_id=uuid.uuid4().hex,
        query=query,
        top_k=1,
        mode="retrieval",
        index=index,
        index_version=version,
        enqueued_at=time.time(),
    )


def _final_events(stack: Stack, request_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The request's events, once its stream has a final one (`done` or `error`)."""
    key = Keys(stack.settings.redis.key_prefix).events(request_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = stack.redis.xrange(key)
        events = [{"type": f[b"type"].decode(), **json.loads(f[b"data"])} for _, f in entries]
        if events and events[-1]["type"] in ("done", "error"):
            return events
        time.sleep(0.05)
    raise AssertionError(f"no final event for {request_id}")


def _version_with_fifo(stack: Stack, embedder: Any, tmp_path: Path) -> tuple[IndexInfo, Path, bytes]:
    """A real next version of ``live`` (ingested as ``staging``, copied under ``live``), its
    chunks file replaced by a FIFO; registered. Returns it, the FIFO and what to write into it."""
    from ragline.workers.retrieval.ingest import ingest

    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "live.md").write_text(FERRY_V2)
    ingest(stack.settings, [tmp_path / "v2"], index_name="staging", embedder=embedder, progress=False)
    client, keys = stack.redis, Keys(stack.settings.redis.key_prefix)
    staged = indexes.lookup(client, keys, "staging")
    assert staged is not None
    folder = Path(stack.settings.indexes_dir) / "live" / staged.version
    shutil.copytree(staged.path, folder)
    info = staged.model_copy(update={"name": "live", "path": str(folder)})
    (folder / "meta.json").write_text(info.encode())
    chunks = (folder / "chunks.jsonl").read_bytes()
    (folder / "chunks.jsonl").unlink()
    os.mkfifo(folder / "chunks.jsonl")
    indexes.register(client, keys, info)
    return info, folder / "chunks.jsonl", chunks


def _open_when_read(fifo: Path, timeout_s: float = 60) -> int:
    """The FIFO's write end, once a reader (the worker's loading thread) has it open."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it yet
            assert time.monotonic() < deadline, "the worker never started loading the new version"
            time.sleep(0.05)


def test_a_new_version_loads_beside_the_served_one_never_inside_a_batch(
    stack: Stack, embedder: Any, tmp_path: Path
) -> None:
    assert "08:40" in _top(_ask(stack, FERRY_Q, "live"))
    assert "Vellmar" in _top(_ask(stack, LIGHTHOUSE_Q, "other"))
    old = indexes.lookup(stack.redis, Keys(stack.settings.redis.key_prefix), "live")
    assert old is not None
    _new, fifo, chunks = _version_with_fifo(stack, embedder, tmp_path)

    order: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        # Names the new version (the API saw it registered): it waits for the load, outside any batch.
        waiting: Future[httpx.Response] = pool.submit(_ask, stack, FERRY_Q, "live")
        writer = _open_when_read(fifo)  # the loading thread is now blocked reading the chunks
        try:
            # Meanwhile: another index, and the old version, each answered by a batch of its own.
            assert "Vellmar" in _top(_ask(stack, LIGHTHOUSE_Q, "other"))
            order.append("other index answered")
            pinned = _request("live", FERRY_Q, old.version)
            _send_batch(stack, [pinned])
            events = _final_events(stack, pinned.request_id)
            assert [e["type"] for e in events] == ["sources", "done"], events
            assert events[0]["index_version"] == old.version and "08:40" in events[0]["sources"][0]["text"]
            order.append("old version answered")
            assert not waiting.done(), "the request for the new version was answered before it loaded"
        finally:
            order.append("new version let load")
            with os.fdopen(writer, "wb") as out:
                out.write(chunks)
        reply = waiting.result(timeout=60)
    assert "09:55" in _top(reply) and reply.json()["sources"][0]["text"]
    assert order == ["other index answered", "old version answered", "new version let load"]
    assert "09:55" in _top(_ask(stack, FERRY_Q, "live"))
    assert stack.workers["retrieval"].proc.poll() is None  # type: ignore[union-attr]


def test_a_request_that_fails_fails_alone_and_names_no_file(stack: Stack, tmp_path: Path) -> None:
    client, keys = stack.redis, Keys(stack.settings.redis.key_prefix)
    gone = tmp_path / "nowhere" / "20260101T000000000000Z-abcdef"
    broken = IndexInfo(name="broken", version="b1", path=str(gone), chunks=3, dim=384)
    indexes.register(client, keys, broken)
    # In one batch: the broken index's request, and two others.
    batch = [
        _request("broken", FERRY_Q, "b1"),
        _request("other", LIGHTHOUSE_Q, None),
        _request("live", FERRY_Q, None),
    ]
    _send_batch(stack, batch)
    failed, other, live = (_final_events(stack, r.request_id) for r in batch)
    [error] = failed
    assert error["type"] == "error" and error["status"] >= 500, error
    assert str(tmp_path) not in error["message"] and "/" not in error["message"], error
    assert [e["type"] for e in other] == ["sources", "done"] and "Vellmar" in other[0]["sources"][0]["text"]
    assert [e["type"] for e in live] == ["sources", "done"]
    # Over HTTP the same: a 5xx with a message that names no file.
    reply = _ask(stack, FERRY_Q, "broken")
    assert reply.status_code >= 500 and "/" not in reply.json()["message"], reply.text
