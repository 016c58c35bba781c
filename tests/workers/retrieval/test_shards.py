"""Sharded indexes on real parts: MiniLM, FAISS, Redis, and shard workers as Celery processes.

One corpus of a few hundred chunks is ingested three ways: unsharded, in 3 hash shards, and in
one shard per `year`. Three shard workers (``ragline worker retrieval --shards``) each serve one
shard of both sharded indexes; the coordinator is this process's BatchRetriever, which sends
the shard searches over their queues as a retrieval worker does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client import REGISTRY
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Done, RetrieveRequest, SearchShardTask, Sources
from ragline.broker.contract.queues import SEARCH_SHARD_TASK
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards

from tests.helpers import Proc, batch_retriever, env_for, pushed_queues, ragline_command, wait_for_workers

pytestmark = pytest.mark.integration

YEARS = ("2022", "2023", "2024")
TOPICS = ("harbour", "orchard", "observatory", "railway", "glacier", "bakery", "library", "vineyard")
QUERIES = (
    "When does the harbour ferry leave in winter?",
    "How are the orchard apples picked?",
    "What can be seen from the observatory dome?",
    "Which railway line crosses the glacier valley?",
)


def _corpus(root: Path, count: int = 96) -> Path:
    """``count`` documents of 4 sections each, a third per year."""
    for i in range(count):
        topic, year = TOPICS[i % len(TOPICS)], YEARS[i % len(YEARS)]
        sections = "\n\n".join(
            f"## {topic.title()} note {j}\n\nIn {year} the {topic} of district {i} reported item {j}: "
            f"the {topic} keeps {i * 7 + j} visitors a week, opens at {8 + j}:{i % 60:02d}, and its "
            f"{TOPICS[(i + j) % len(TOPICS)]} partner sends {j + i % 5} reports a month about the season."
            for j in range(4)
        )
        (root / f"doc-{i:03d}.md").write_text(
            f"---\nyear: {year}\n---\n# {topic.title()} {i}\n\n{sections}\n"
        )
    return root


@pytest.fixture(scope="module")
def sharded(settings: Settings, embedder, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    from ragline.workers.retrieval.ingest import ingest
    from ragline.workers.retrieval.sharded_ingest import ingest_sharded

    corpus = _corpus(tmp_path_factory.mktemp("sharded-corpus"))
    ingest(settings, [corpus], index_name="flat", embedder=embedder, progress=False)
    hashed = ingest_sharded(
        settings, [corpus], index_name="hashed", count=3, embedder=embedder, progress=False
    )
    assert hashed.shard_map.keys == ("0", "1", "2") and 300 <= hashed.info.chunks <= 450
    ingest_sharded(settings, [corpus], index_name="years", shard_by="year", embedder=embedder, progress=False)
    return settings


@pytest.fixture(scope="module")
def shard_workers(sharded: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    logs = tmp_path_factory.mktemp("shard-logs")
    own = sharded.replace(worker_metrics_port=0)
    procs = [
        Proc(
            f"shard-worker-{i}",
            ragline_command("worker", "retrieval", "--shards", f"hashed:{i},years:{YEARS[i]}"),
            env_for(own),
            logs / f"shard-{i}.log",
        )
        for i in range(3)
    ]
    for p in procs:
        p.start()
    try:
        queues = tuple(shards.shard_queue(s) for m in ("hashed", "years") for s in _map(sharded, m).shards)
        wait_for_workers(sharded, queues, procs, timeout=300)
        yield procs
    finally:
        for p in procs:
            p.stop()


def _map(settings: Settings, index: str) -> shards.ShardMap:
    found = shards.lookup(
        redis.Redis.from_url(settings.redis.redis_url), Keys(settings.redis.key_prefix), index
    )
    assert found is not None
    return found


def _coordinator(settings: Settings, embedder, *, held: frozenset[str] | None, timeout_ms: int = 3000):
    """A retrieval worker's BatchRetriever and ShardSearch, in this process."""
    from ragline.workers.retrieval.shard_search import ShardSearch

    s = settings.replace(shard_timeout_ms=timeout_ms)
    retriever = batch_retriever(s, embedder)
    app = create_celery(s.redis)

    def send(task: SearchShardTask) -> None:
        app.send_task(SEARCH_SHARD_TASK, kwargs=task.encode(), queue=shards.shard_queue(task.shard))

    client = redis.Redis.from_url(s.redis.redis_url, socket_timeout=5)
    retriever._shards = ShardSearch(
        client,
        Keys(s.redis.key_prefix),
        s.retrieval,
        retriever.indexes,
        send,
        held=held,
        socket_timeout_s=5.0,
        heartbeat_ttl_s=s.redis.worker_heartbeat_ttl_s,
    )
    return retriever


def _ask(retriever, index: str, *, top_k: int = 5, **extra: object) -> dict[str, tuple[Sources, Done]]:
    requests = [
        RetrieveRequest(
            request_id=f"{index}-{i}",
            query=q,
            top_k=top_k,
            mode="retrieval",
            index=index,
            retrieval="dense",
            # Effort enough for HNSW to be exact on a few hundred chunks: the comparison is of
            # sharding, not of the graph's approximation at two sizes.
            ef_search=256,
            enqueued_at=time.time(),
            **extra,  # type: ignore[arg-type]
        )
        for i, q in enumerate(QUERIES)
    ]
    result = retriever.run(requests, picked_at=time.time())
    events: dict[str, list] = {}
    for rid, event in result.events:
        events.setdefault(rid, []).append(event)
    return {rid: (found[0], found[1]) for rid, found in events.items()}


def _top(answers: dict[str, tuple[Sources, Done]]) -> list[list[tuple[str, float]]]:
    return [[(s.chunk_id, round(s.score, 5)) for s in answers[rid][0].sources] for rid in sorted(answers)]


def _as(answers: dict[str, tuple[Sources, Done]], index: str) -> dict[str, tuple[Sources, Done]]:
    return {rid.replace(index, "x"): a for rid, a in answers.items()}


def test_shards_held_in_process_answer_as_the_unsharded_index(sharded: Settings, embedder) -> None:
    retriever = _coordinator(sharded, embedder, held=None)
    flat = _as(_ask(retriever, "flat"), "flat")
    for index in ("hashed", "years"):
        answers = _as(_ask(retriever, index), index)
        assert _top(answers) == _top(flat)
        sources, done = answers["x-0"]
        assert sources.index == index and not sources.partial and not done.partial
    plain = _as(_ask(retriever, "flat", diversity=False), "flat")
    assert _top(_as(_ask(retriever, "hashed", diversity=False), "hashed")) == _top(plain)


def test_shards_over_their_queues_answer_as_the_unsharded_index(
    sharded: Settings, embedder, shard_workers: list[Proc]
) -> None:
    retriever = _coordinator(sharded, embedder, held=frozenset())
    flat = _as(_ask(retriever, "flat", top_k=8), "flat")
    with pushed_queues(sharded.redis.redis_url) as pushed:
        hashed = _as(_ask(retriever, "hashed", top_k=8), "hashed")
    assert _top(hashed) == _top(flat)
    assert not any(s.partial for s, _ in hashed.values())
    # One shard search per shard for the whole batch of queries: embedded once, sent once.
    assert sorted(q for q in pushed if q.startswith("retrieval.")) == [
        "retrieval.hashed.shard-0",
        "retrieval.hashed.shard-1",
        "retrieval.hashed.shard-2",
    ]


def test_a_filter_on_the_shard_field_touches_only_its_shard(
    sharded: Settings, embedder, shard_workers: list[Proc]
) -> None:
    retriever = _coordinator(sharded, embedder, held=frozenset())
    flat = _as(_ask(retriever, "flat", filter={"year": "2023"}), "flat")
    with pushed_queues(sharded.redis.redis_url) as pushed:
        routed = _as(_ask(retriever, "years", filter={"year": "2023"}), "years")
    assert _top(routed) == _top(flat)
    assert [q for q in pushed if q.startswith("retrieval.")] == ["retrieval.years.shard-2023"]
    with pushed_queues(sharded.redis.redis_url) as pushed:
        _ask(retriever, "years", filter={"year": ["2022", "2024"]})
    assert sorted(q for q in pushed if q.startswith("retrieval.")) == [
        "retrieval.years.shard-2022",
        "retrieval.years.shard-2024",
    ]


@pytest.fixture(scope="module")
def coordinator(sharded: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A retrieval worker that takes batches and holds no shard (``--shards none``)."""
    log = tmp_path_factory.mktemp("coordinator-logs") / "coordinator.log"
    proc = Proc(
        "coordinator",
        ragline_command("worker", "retrieval", "--shards", "none"),
        env_for(sharded.replace(worker_metrics_port=0)),
        log,
    )
    proc.start()
    try:
        wait_for_workers(sharded, ("retrieval",), [proc], timeout=300)
        yield proc
    finally:
        proc.stop()


def test_the_api_answers_from_shards_through_a_coordinating_worker(
    sharded: Settings, shard_workers: list[Proc], coordinator: Proc, api
) -> None:
    def ask(index: str) -> dict:
        body = {"query": QUERIES[0], "mode": "retrieval", "index": index, "top_k": 5, "retrieval": "dense"}
        reply = httpx.post(f"{api.base}/v1/query", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()

    flat, hashed = ask("flat"), ask("hashed")
    assert hashed["partial"] is False and hashed["partial_shards"] == []
    assert [s["chunk_id"] for s in hashed["sources"]] == [s["chunk_id"] for s in flat["sources"]]
    assert "hashed" in [i["name"] for i in httpx.get(f"{api.base}/v1/indexes", timeout=10).json()["indexes"]]


def test_reingesting_one_shard_swaps_only_it(sharded: Settings, embedder, tmp_path: Path) -> None:
    from ragline.workers.retrieval.sharded_ingest import ingest_sharded

    client = redis.Redis.from_url(sharded.redis.redis_url)
    keys = Keys(sharded.redis.key_prefix)
    before = {s: indexes.lookup(client, keys, s) for s in _map(sharded, "years").shards}
    logical = indexes.lookup(client, keys, "years")
    (tmp_path / "late.md").write_text(
        "---\nyear: 2024\n---\n# Harbour late\n\nThe harbour closes at 23:10 in 2024."
    )
    ingest_sharded(
        sharded, [tmp_path], index_name="years", shard_by="year", embedder=embedder, progress=False
    )
    after = {s: indexes.lookup(client, keys, s) for s in _map(sharded, "years").shards}
    assert after["years.shard-2024"] != before["years.shard-2024"]
    assert after["years.shard-2022"] == before["years.shard-2022"]
    assert after["years.shard-2023"] == before["years.shard-2023"]
    assert indexes.lookup(client, keys, "years").version != logical.version  # type: ignore[union-attr]
    retriever = _coordinator(sharded, embedder, held=None)
    answers = _ask(retriever, "years", filter={"year": "2024"})
    assert any("23:10" in s.text for s in answers["years-0"][0].sources)


def test_a_killed_shard_worker_gives_a_partial_answer_within_the_budget(
    sharded: Settings, embedder, shard_workers: list[Proc], api
) -> None:
    budget_ms = 1500
    retriever = _coordinator(sharded, embedder, held=frozenset(), timeout_ms=budget_ms)
    killed = shard_workers[2].proc
    assert killed is not None
    os.killpg(killed.pid, signal.SIGKILL)  # no goodbye heartbeat
    killed.wait()
    started = time.monotonic()
    answers = _ask(retriever, "hashed")
    elapsed = time.monotonic() - started
    assert elapsed < budget_ms / 1000 + 1.0
    for sources, done in answers.values():
        assert sources.partial and sources.partial_shards == ["hashed.shard-2"]
        assert done.partial and done.partial_shards == ["hashed.shard-2"]
        assert sources.sources  # the other shards still answer
    # Readiness names the shards left without a worker once its heartbeat has gone stale.
    deadline = time.monotonic() + 10
    while True:
        body = httpx.get(f"{api.base}/readyz", timeout=5).json()
        if body.get("shards_without_worker") == ["hashed.shard-2", "years.shard-2024"]:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.3)


def test_a_sharded_index_is_registered_again_from_disk(sharded: Settings) -> None:
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.sharded_ingest import register_sharded

    client = redis.Redis.from_url(sharded.redis.redis_url)
    keys = Keys(sharded.redis.key_prefix)
    before = indexes.lookup(client, keys, "hashed")
    # What a Redis restart without persistence leaves: no map, no logical entry.
    client.hdel(keys.shard_maps, "hashed")
    client.hdel(keys.indexes, "hashed")
    found = {m.index: m for m in index_store.shard_maps_on_disk(sharded.indexes_dir)}
    assert found["hashed"].keys == ("0", "1", "2")
    assert register_sharded(client, keys, sharded.indexes_dir, found["hashed"]) == before
    assert shards.lookup(client, keys, "hashed") == found["hashed"]


@contextlib.contextmanager
def _small_index(settings: Settings, embedder, root: Path, name: str) -> Iterator[shards.ShardMap]:
    """A sharded index of 6 documents, one shard per year, dropped afterwards (from Redis and
    from disk), so no later readiness check or worker start finds it."""
    from ragline.workers.retrieval.sharded_ingest import ingest_sharded

    corpus = root / name
    corpus.mkdir()
    report = ingest_sharded(
        settings, [_corpus(corpus, 6)], index_name=name, shard_by="year", embedder=embedder, progress=False
    )
    try:
        yield report.shard_map
    finally:
        client = redis.Redis.from_url(settings.redis.redis_url)
        keys = Keys(settings.redis.key_prefix)
        client.hdel(keys.shard_maps, name)
        client.hdel(keys.indexes, name, *report.shard_map.shards)
        for folder in (name, *report.shard_map.shards):
            shutil.rmtree(settings.indexes_dir / folder, ignore_errors=True)


def _wait_beating(settings: Settings, proc: Proc, queues: tuple[str, ...], timeout: float) -> None:
    """Until ``proc``'s worker has a heartbeat on each of ``queues``."""
    assert proc.proc is not None
    client = redis.Redis.from_url(settings.redis.redis_url)
    keys = Keys(settings.redis.key_prefix)
    member = f"{socket.gethostname()}:{proc.proc.pid}"  # `ragline worker` execs the worker
    deadline = time.monotonic() + timeout
    while not all(client.zscore(keys.workers(q), member) for q in queues):
        if proc.proc.poll() is not None:
            pytest.fail(f"{proc.name} exited ({proc.proc.returncode}):\n{proc.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.name} does not consume {queues}:\n{proc.tail()}")
        time.sleep(0.2)


def test_a_shard_nobody_serves_is_left_out_at_once(sharded: Settings, embedder, tmp_path: Path) -> None:
    budget_ms = 5000
    with _small_index(sharded, embedder, tmp_path, "unserved") as shard_map:
        held, *unserved = shard_map.shards
        retriever = _coordinator(sharded, embedder, held=frozenset({held}), timeout_ms=budget_ms)
        sample = ("ragline_shard_missing_total", {"shard": unserved[0]})
        before = REGISTRY.get_sample_value(*sample) or 0.0
        with pushed_queues(sharded.redis.redis_url) as pushed:
            started = time.monotonic()
            answers = _ask(retriever, "unserved")
            elapsed = time.monotonic() - started
    # No heartbeat on their queues: nothing sent to them, no wait for them.
    assert elapsed < budget_ms / 1000 / 2, elapsed
    assert not [q for q in pushed if q.startswith("retrieval.")]
    for sources, done in answers.values():
        assert sources.partial and sources.partial_shards == unserved
        assert done.partial_shards == unserved
        assert sources.sources  # the shard held here still answers
    assert REGISTRY.get_sample_value(*sample) == before + 1


def test_a_default_worker_serves_shards_ingested_after_it_started(
    sharded: Settings, embedder, tmp_path: Path
) -> None:
    own = sharded.replace(worker_metrics_port=0, shard_watch_s=0.5)
    proc = Proc("all-shards-worker", ragline_command("worker", "retrieval"), env_for(own), tmp_path / "w.log")
    proc.start()
    try:
        # Its own heartbeat (another worker may take batches here), so the index below is
        # registered after this worker read the shard maps to choose its queues.
        _wait_beating(sharded, proc, ("retrieval",), timeout=300)
        with _small_index(sharded, embedder, tmp_path, "late") as shard_map:
            queues = tuple(shards.shard_queue(s) for s in shard_map.shards)
            _wait_beating(sharded, proc, queues, timeout=30)
            remote = _coordinator(sharded, embedder, held=frozenset())
            local = _coordinator(sharded, embedder, held=None)
            with pushed_queues(sharded.redis.redis_url) as pushed:
                answers = _as(_ask(remote, "late"), "late")
            assert sorted(q for q in pushed if q.startswith("retrieval.")) == sorted(queues)
            assert not any(s.partial for s, _ in answers.values())
            assert _top(answers) == _top(_as(_ask(local, "late"), "late"))
    finally:
        proc.stop()


def test_a_hash_sharded_index_keeps_its_count(sharded: Settings) -> None:
    from ragline.workers.retrieval.sharded_ingest import planned_map

    client = redis.Redis.from_url(sharded.redis.redis_url)
    keys = Keys(sharded.redis.key_prefix)
    assert _map(sharded, "hashed").count == 3
    assert planned_map(client, keys, "hashed", count=3, shard_by=None) == _map(sharded, "hashed")
    # A fourth shard would hash documents already placed to another one: they would be in two.
    with pytest.raises(ValueError, match="--shards 3"):
        planned_map(client, keys, "hashed", count=4, shard_by=None)
