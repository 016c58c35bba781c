"""Documents over HTTP on a real stack: an API with keys, a retrieval worker and an ingest worker
(MiniLM, FAISS), on a Redis database and a home folder of their own. Everything goes through
ragline.client; the refusals are checked on the wire too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from ragline.client import (
    BadRequest,
    Client,
    Conflict,
    DocumentIn,
    Forbidden,
    InvalidRequest,
    JobFailed,
    JobView,
    NotFound,
    PayloadTooLarge,
    SourcesEvent,
    UnsupportedMediaType,
)
from ragline.client.events import DoneEvent
from tests.helpers import CAFE_DOC, FILLER_DOCS, redis_db_after, stack_on_db

pytestmark = pytest.mark.integration

INDEX = "docs"
UPLOAD_MAX_BYTES = 400_000
UPLOAD_MAX_DOCUMENTS = 100
SHARD_LIMIT = 5
LIGHTHOUSE = (
    "# The Vellmar lighthouse\n\nThe Vellmar lighthouse stands on Gull Point. Its keeper, Ingrid "
    "Solberg, paints the tower red and white every fourth summer. Visitors may climb its 212 steps "
    "on Saturdays."
)


@dataclass
class Keyed:
    base: str
    settings: Settings
    redis: redis.Redis
    admin: str
    writer: str  # write:docs
    reader: str
    legacy: str  # recorded before scopes existed


def _legacy_key(client: redis.Redis, keys: Keys) -> str:
    """A key whose record has no scopes, as `ragline keys create` wrote them before."""
    key, record = apikeys.create(client, keys, "legacy")
    old = apikeys.ApiKey(record.id, record.name, record.created_at)
    raw = old.to_json().replace(', "scopes": null', "")
    client.hset(keys.api_keys, apikeys.digest(key), raw)
    return key


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    # The durability tests' database, theirs only while their module runs: each stack flushes it.
    url = redis_db_after(settings.redis.redis_url, 1, "RAGLINE_TEST_DOCUMENTS_REDIS_URL")
    home = tmp_path_factory.mktemp("documents-home")
    with stack_on_db(
        settings,
        url,
        ("retrieval", "ingest"),
        tmp_path_factory.mktemp("documents-logs"),
        home=home,
        auth_enabled=True,
        default_index=INDEX,
        upload_max_bytes=UPLOAD_MAX_BYTES,
        upload_max_documents=UPLOAD_MAX_DOCUMENTS,
        max_shards_per_index=SHARD_LIMIT,
        rate_limit_enabled=False,
    ) as running:
        client, keys = running.redis, Keys(running.settings.redis.key_prefix)
        yield Keyed(
            running.base,
            running.settings,
            client,
            admin=apikeys.create(client, keys, "admin", scopes=["admin"])[0],
            writer=apikeys.create(client, keys, "writer", scopes=[f"write:{INDEX}"])[0],
            reader=apikeys.create(client, keys, "reader")[0],
            legacy=_legacy_key(client, keys),
        )


def _files(tmp_path: Path) -> list[Path]:
    (tmp_path / "cafe.md").write_text(CAFE_DOC)
    paths = [tmp_path / "cafe.md"]
    for name, text in FILLER_DOCS.items():
        (tmp_path / name).write_text(text)
        paths.append(tmp_path / name)
    return paths


def _ask(rl: Client, query: str, index: str = INDEX) -> tuple[SourcesEvent, DoneEvent]:
    events = list(rl.stream(query, index=index, mode="retrieval", top_k=3))
    sources = next(e for e in events if isinstance(e, SourcesEvent))
    done = events[-1]
    assert isinstance(done, DoneEvent), events
    return sources, done


@pytest.fixture(scope="module")
def first_version(stack: Keyed, tmp_path_factory: pytest.TempPathFactory) -> JobView:
    """The index made by a multipart upload of the test corpus, its progress watched meanwhile."""
    seen: list[JobView] = []
    with Client(stack.base, api_key=stack.writer) as rl:
        started = rl.upload(INDEX, files=_files(tmp_path_factory.mktemp("corpus")), wait=False)
        seen.append(started)
        deadline = time.monotonic() + 300
        while seen[-1].status not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline, seen[-1]
            time.sleep(0.05)
            seen.append(rl.job(started.job_id))
    job = seen[-1]
    assert job.status == "done", job
    seen_progress = [v.progress for v in seen if v.progress is not None]
    assert seen_progress, "the record never showed progress"
    return job


def test_a_multipart_upload_makes_the_index_and_its_job_shows_progress(
    stack: Keyed, first_version: JobView
) -> None:
    job = first_version
    assert job.kind == "ingest"
    assert job.request.index == INDEX and job.request.operation == "add"
    assert sorted(job.request.documents) == sorted(["cafe.md", *FILLER_DOCS])
    result = job.result
    assert result is not None and result.version
    assert (result.documents, result.added, result.reused) == (1 + len(FILLER_DOCS), 1 + len(FILLER_DOCS), 0)
    # The record ends with every chunk embedded of the total, and the new version.
    assert job.progress is not None
    assert job.progress.chunks_embedded == job.progress.chunks_total == result.embedded == result.chunks
    with Client(stack.base, api_key=stack.reader) as rl:
        detail = rl.index(INDEX)
        assert (detail.version, detail.documents, detail.chunks) == (result.version, 5, result.chunks)
        sources, _ = _ask(rl, "When does Café Lumière open?")
    assert sources.index_version == result.version
    assert sources.sources[0].source == "cafe.md"
    assert sources.sources[0].title.startswith("Café Lumière")


def test_documents_are_listed_a_page_at_a_time(stack: Keyed, first_version: JobView) -> None:
    with Client(stack.base, api_key=stack.reader) as rl:
        pages, after = [], None
        while True:
            page = rl.documents(INDEX, after=after, limit=2)
            pages.append(page)
            after = page.next_after
            if after is None:
                break
    assert len(pages) == 3
    listed = [d for page in pages for d in page.documents]
    assert [d.id for d in listed] == sorted(["cafe.md", *FILLER_DOCS])
    assert {page.total for page in pages} == {5}
    assert {page.version for page in pages} == {first_version.result.version}  # type: ignore[union-attr]
    cafe = next(d for d in listed if d.id == "cafe.md")
    assert (cafe.title, cafe.path) == ("Café Lumière", "cafe.md")
    assert sum(d.chunks for d in listed) == first_version.result.chunks  # type: ignore[union-attr]


def test_writes_need_an_admin_or_write_scope(stack: Keyed, first_version: JobView) -> None:
    doc: DocumentIn = {"id": "x", "text": "some text"}
    for key in (stack.reader, stack.legacy):
        with Client(stack.base, api_key=key, retries=0) as rl:
            with pytest.raises(Forbidden) as refused:
                rl.upload(INDEX, documents=[doc])
            assert f"write:{INDEX}" in refused.value.message and "admin" in refused.value.message
            with pytest.raises(Forbidden):
                rl.delete_document(INDEX, "cafe.md")
            with pytest.raises(Forbidden):
                rl.delete_index(INDEX)
            # Reading is what they could always do.
            assert rl.documents(INDEX).total == 5
    with Client(stack.base, api_key=stack.writer, retries=0) as rl, pytest.raises(Forbidden):
        rl.upload("other", documents=[doc])


def test_refusals_415_413_and_past_the_count(stack: Keyed, first_version: JobView) -> None:
    url = f"{stack.base}/v1/indexes/{INDEX}/documents"
    headers = {"Authorization": f"Bearer {stack.admin}"}
    with Client(stack.base, api_key=stack.admin, retries=0) as rl:
        with pytest.raises(UnsupportedMediaType) as pdf:
            rl.upload(INDEX, files=[("report.pdf", b"%PDF-1.4")])
        assert "report.pdf" in pdf.value.message and ".md" in pdf.value.message
        with pytest.raises(PayloadTooLarge) as large:
            rl.upload(INDEX, files=[("big.txt", b"word " * (UPLOAD_MAX_BYTES // 5 + 1))])
        assert str(UPLOAD_MAX_BYTES) in large.value.message
        too_many: list[DocumentIn] = [{"id": f"d{i}", "text": "t"} for i in range(UPLOAD_MAX_DOCUMENTS + 1)]
        with pytest.raises(InvalidRequest) as many:
            rl.upload(INDEX, documents=too_many)
        assert f"the limit is {UPLOAD_MAX_DOCUMENTS}" in many.value.message
        with pytest.raises(NotFound):
            rl.delete_document(INDEX, "no-such-document")
    reply = httpx.post(url, content=b"plain", headers={**headers, "Content-Type": "text/plain"})
    assert reply.status_code == 415, reply.text
    reply = httpx.post(url, json={"documents": [{"id": "a", "text": "t", "colour": "red"}]}, headers=headers)
    assert reply.status_code == 422 and "colour" in reply.json()["message"]
    # The refusals left the index as it was.
    with Client(stack.base, api_key=stack.reader) as rl:
        assert rl.index(INDEX).version == first_version.result.version  # type: ignore[union-attr]


def test_metadata_past_a_limit_is_refused_at_the_door_or_fails_its_job(
    stack: Keyed, first_version: JobView
) -> None:
    """The API checks an upload's metadata; only the ingest worker sees a file's front matter."""
    wide = "---\n" + "".join(f"k{i}: v\n" for i in range(40)) + "---\n# Wide\n\nA page of many fields."
    with Client(stack.base, api_key=stack.admin, retries=0) as rl:
        before = rl.index(INDEX).version
        with pytest.raises(InvalidRequest) as door:
            rl.upload(INDEX, documents=[{"id": "m", "text": "Some text.", "metadata": {"note": "x" * 2000}}])
        assert "RAGLINE_METADATA_MAX_VALUE_CHARS" in door.value.message and "'m'" in door.value.message
        with pytest.raises(PayloadTooLarge) as large:
            metadata = {f"k{i}": "x" * 1000 for i in range(10)}
            rl.upload(INDEX, documents=[{"id": "m", "text": "Some text.", "metadata": metadata}])
        assert "RAGLINE_METADATA_MAX_BYTES" in large.value.message
        with pytest.raises(JobFailed) as failed:
            rl.upload(INDEX, files=[("wide.md", wide.encode())])
        error = failed.value.job.error
        assert error is not None and error.status == 422, error
        assert "'wide.md'" in error.message and "RAGLINE_METADATA_MAX_KEYS" in error.message
        assert rl.index(INDEX).version == before


def test_json_documents_join_the_next_version_and_the_old_one_answers_until_the_swap(
    stack: Keyed, first_version: JobView
) -> None:
    question = "Who paints the Vellmar lighthouse?"
    old = first_version.result.version  # type: ignore[union-attr]
    filler: list[DocumentIn] = [
        {"id": f"notes/{i:03d}", "text": f"Note {i}. " + " ".join(f"word{i}x{j}" for j in range(150))}
        for i in range(60)
    ]
    docs: list[DocumentIn] = [
        {"id": "lighthouse", "text": LIGHTHOUSE, "format": "md", "metadata": {"topic": "sights"}},
        *filler,
    ]
    # Each answer during the ingest: (from the new version, cached, the job's status after, its
    # phase). A cached answer names no version, so its sources tell: only the new version has
    # the lighthouse.
    samples: list[tuple[bool, bool, str, str | None]] = []
    with Client(stack.base, api_key=stack.admin) as rl:
        before, _ = _ask(rl, question)
        assert before.index_version == old
        assert all(s.source != "lighthouse" for s in before.sources)
        _, again = _ask(rl, question)
        assert again.cached, "the second ask of the old version is a cache hit"
        started = rl.upload(INDEX, documents=docs, wait=False)
        deadline = time.monotonic() + 300
        while True:
            sources, done = _ask(rl, question)
            job = rl.job(started.job_id)
            phase = job.progress.phase if job.progress else None
            newer = sources.sources[0].source == "lighthouse"
            samples.append((newer, done.cached, job.status, phase))
            if job.status in ("done", "failed"):
                break
            assert time.monotonic() < deadline, job
        assert job.status == "done", job
        new = job.result.version  # type: ignore[union-attr]
        after, after_done = _ask(rl, question)
    assert new != old
    # Answered before the swap (the job still short of registering when the answer was back):
    # the old version, from its cache entry.
    before_swap = [s for s in samples if s[2] in ("queued", "ingesting") and s[3] != "registering"]
    assert before_swap and not any(s[0] for s in before_swap), samples
    assert all(s[1] for s in before_swap), samples
    assert any(s[2] == "ingesting" and s[3] == "embedding" for s in before_swap), (
        f"no query was answered while the ingest embedded: {samples}"
    )
    # Once an answer came from the new version, none came from the old: the old version's cache
    # entry was never served after the swap, and the new version's first answer was computed.
    flags = [s[0] for s in samples]
    assert flags == sorted(flags), samples
    first_new = next((s for s in samples if s[0]), None)
    assert first_new is None or not first_new[1], samples
    assert after.index_version in (new, None, "")
    assert after.sources[0].source == "lighthouse", after.sources
    assert after.sources[0].title == "The Vellmar lighthouse"
    assert after_done.cached == (first_new is not None)  # the new version's own entry, if made
    # Only the new documents were embedded; the old ones' vectors were reused.
    result = job.result
    assert result is not None
    assert result.reused == first_version.result.chunks  # type: ignore[union-attr]
    assert result.embedded == result.chunks - result.reused
    assert result.documents == 5 + len(docs)
    assert job.progress is not None and job.progress.chunks_embedded == result.embedded


def test_a_deleted_document_is_gone_from_the_next_version(stack: Keyed, first_version: JobView) -> None:
    with Client(stack.base, api_key=stack.writer) as rl:
        job = rl.delete_document(INDEX, "trains.txt")
        assert job.result is not None and job.result.removed == 1
        ids = {d.id for d in rl.documents(INDEX, limit=1000).documents}
        assert "trains.txt" not in ids and "cafe.md" in ids
        sources, _ = _ask(rl, "When does the regional train to the coast leave?")
    assert sources.index_version == job.result.version
    assert all(s.source != "trains.txt" for s in sources.sources)


def test_a_deleted_index_answers_404_at_once_and_its_files_go(stack: Keyed) -> None:
    with Client(stack.base, api_key=stack.admin, retries=0) as rl:
        made = rl.upload("scratch", documents=[{"id": "one", "text": "A short note about kites."}])
        folder = Path(stack.settings.indexes_dir, "scratch")
        assert folder.is_dir()
        started = rl.delete_index("scratch", wait=False)
        with pytest.raises(NotFound):
            rl.index("scratch")
        with pytest.raises(NotFound):
            list(rl.stream("kites", index="scratch", mode="retrieval"))
        job = rl.wait_job(started.job_id, timeout=120)
        assert job.status == "done", job
        assert not folder.exists()
        assert made.result is not None
        # The name is free again.
        again = rl.upload("scratch", documents=[{"id": "two", "text": "Kites fly on windy days."}])
        assert again.result is not None and again.result.documents == 1


def test_a_cancelled_upload_registers_nothing(stack: Keyed, first_version: JobView) -> None:
    with Client(stack.base, api_key=stack.admin) as rl:
        version = rl.index(INDEX).version
        # Held by "another ingest": the upload waits queued, and is cancelled there.
        lock = stack.redis.lock(Keys(stack.settings.redis.key_prefix).ingest_lock(INDEX), timeout=60)
        assert lock.acquire(blocking=False)
        try:
            started = rl.upload(INDEX, documents=[{"id": "late", "text": "never indexed"}], wait=False)
            time.sleep(1.5)
            assert rl.job(started.job_id).status == "queued"
            cancelled = rl.cancel_job(started.job_id)
            assert cancelled.status == "cancelled"
        finally:
            lock.release()
        time.sleep(2)
        assert rl.index(INDEX).version == version
        assert "late" not in {d.id for d in rl.documents(INDEX, limit=1000).documents}
    staged = Path(stack.settings.uploads_dir, started.job_id)
    deadline = time.monotonic() + 10
    while staged.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not staged.exists(), "the staged upload outlived its job"


def test_the_async_client_uploads_and_lists(stack: Keyed, first_version: JobView) -> None:
    import asyncio

    from ragline.client import AsyncClient

    async def run() -> tuple[JobView, int]:
        async with AsyncClient(stack.base, api_key=stack.admin) as rl:
            job = await rl.upload("async-docs", files=[("faq.md", "# FAQ\n\nThe ferry runs hourly.")])
            page = await rl.documents("async-docs")
            await rl.delete_index("async-docs")
            return job, page.total

    job, total = asyncio.run(run())
    assert job.status == "done" and total == 1


# -- a sharded index through the same endpoints ------------------------------------------------

YEARS = ("2022", "2023", "2024")
PLACES = ("harbour", "orchard", "observatory", "railway", "glacier", "brewery", "library", "vineyard", "mill")


@pytest.fixture(scope="module")
def sharded(stack: Keyed, embedder: object, tmp_path_factory: pytest.TempPathFactory) -> Keyed:
    """Two sharded indexes of nine documents, made as `ragline ingest` makes them: ``years`` (one
    shard per `year`) and ``hashed`` (3 hash shards)."""
    from ragline.workers.retrieval.sharded_ingest import ingest_sharded

    corpus = tmp_path_factory.mktemp("sharded-corpus")
    for i, place in enumerate(PLACES):
        (corpus / f"doc-{i}.md").write_text(
            f"---\nyear: {YEARS[i % 3]}\n---\n# The {place} of district {i}\n\nThe {place} of district "
            f"{i} opens at {7 + i} in the morning and keeps {i * 11 + 3} visitors a week."
        )
    made = dict(embedder=embedder, progress=False)
    ingest_sharded(stack.settings, [corpus], index_name="years", shard_by="year", **made)  # type: ignore[arg-type]
    ingest_sharded(stack.settings, [corpus], index_name="hashed", count=3, **made)  # type: ignore[arg-type]
    return stack


def _shard_versions(stack: Keyed, rl: Client, index: str) -> dict[str, str]:
    """Each shard's version by its key, as the API shows it."""
    from ragline.broker.state import shards

    shard_map = shards.lookup(stack.redis, Keys(stack.settings.redis.key_prefix), index)
    assert shard_map is not None and rl.index(index).shards == len(shard_map.keys)
    return {k: rl.index(s).version for k, s in zip(shard_map.keys, shard_map.shards, strict=True)}


def _hash_keys() -> set[str]:
    from ragline.broker.state.shards import hash_shard

    return {hash_shard(f"doc-{i}.md", 3) for i in range(len(PLACES))}


def _ids(rl: Client, index: str) -> list[str]:
    return [d.id for d in rl.documents(index, limit=1000).documents]


def test_a_sharded_index_is_listed_once_with_its_shards_summed(sharded: Keyed) -> None:
    with Client(sharded.base, api_key=sharded.reader) as rl:
        listed = {ix.name: ix for ix in rl.indexes().indexes}
        years = rl.index("years")
        shard = rl.index("years.shard-2023")
        parts = [rl.index(f"years.shard-{y}") for y in YEARS]
    assert not [n for n in listed if ".shard-" in n], listed
    assert (listed["years"].index_type, listed["years"].shards) == ("sharded", 3)
    assert listed["hashed"].shards == len(_hash_keys())
    assert all(ix.shards is None for name, ix in listed.items() if name not in ("years", "hashed"))
    assert years.documents == len(PLACES) == sum(p.documents or 0 for p in parts)
    assert years.chunks == sum(p.chunks for p in parts) and years.shard_of is None
    # One shard on its own, by name: what it is part of.
    assert (shard.shard_of, shard.shards, shard.index_type) == ("years", None, "hnsw")
    assert shard.documents == 3


def test_a_sharded_index_lists_every_shards_documents(sharded: Keyed) -> None:
    with Client(sharded.base, api_key=sharded.reader) as rl:
        pages, after = [], None
        while True:
            page = rl.documents("hashed", after=after, limit=4)
            pages.append(page)
            if (after := page.next_after) is None:
                break
        version = rl.index("hashed").version
    assert [d.id for page in pages for d in page.documents] == [f"doc-{i}.md" for i in range(len(PLACES))]
    assert [len(p.documents) for p in pages] == [4, 4, 1]
    assert {p.total for p in pages} == {len(PLACES)} and {p.version for p in pages} == {version}


def test_deleting_a_document_of_a_sharded_index_changes_only_its_shard(sharded: Keyed) -> None:
    with Client(sharded.base, api_key=sharded.admin) as rl:
        before, logical = _shard_versions(sharded, rl, "years"), rl.index("years").version
        job = rl.delete_document("years", "doc-4.md")  # year 2023
        after = _shard_versions(sharded, rl, "years")
        assert job.result is not None and job.result.removed == 1
        assert job.result.version == rl.index("years").version != logical
        assert "doc-4.md" not in _ids(rl, "years") and len(_ids(rl, "years")) == len(PLACES) - 1
        sources, _ = _ask(rl, "When does the glacier of district 4 open?", index="years")
        with pytest.raises(NotFound):
            rl.delete_document("years", "doc-4.md")
    assert after["2023"] != before["2023"]
    assert (after["2022"], after["2024"]) == (before["2022"], before["2024"])
    assert not any(s.source.endswith("doc-4.md") for s in sources.sources)


def test_an_upload_to_a_sharded_index_goes_to_its_documents_shard(sharded: Keyed) -> None:
    from ragline.broker.state.shards import hash_shard

    bakery = "# The Quillfeather bakery\n\nThe Quillfeather bakery sells rye bread on Tuesdays only."
    with Client(sharded.base, api_key=sharded.admin) as rl:
        # By hash: the shard the document's id hashes to, as `ragline ingest --shards 3` places it.
        before = _shard_versions(sharded, rl, "hashed")
        job = rl.upload("hashed", documents=[{"id": "quill.md", "text": bakery, "format": "md"}])
        after = _shard_versions(sharded, rl, "hashed")
        target = hash_shard("quill.md", 3)
        assert [k for k in after if after[k] != before.get(k)] == [target]
        assert job.result is not None and job.result.version == rl.index("hashed").version
        assert "quill.md" in _ids(rl, "hashed")
        sources, _ = _ask(rl, "Which bakery sells rye bread on Tuesdays?", index="hashed")
        assert sources.sources[0].source == "quill.md"

        # By field: doc-0.md moves from 2022 to 2023, so its copy in 2022 goes.
        moved = {"id": "doc-0.md", "text": "The harbour of district 0 moved.", "metadata": {"year": "2023"}}
        rl.upload("years", documents=[moved])  # type: ignore[list-item]
        assert "doc-0.md" not in _ids(rl, "years.shard-2022")
        assert "doc-0.md" in _ids(rl, "years.shard-2023") and _ids(rl, "years").count("doc-0.md") == 1
        # A value no shard had yet makes a shard.
        late = {"id": "late.md", "text": bakery, "format": "md", "metadata": {"year": "2025"}}
        rl.upload("years", documents=[late])  # type: ignore[list-item]
        assert rl.index("years").shards == 4
        assert rl.index("years.shard-2025").shard_of == "years"
        sources, _ = _ask(rl, "Which bakery sells rye bread on Tuesdays?", index="years")
        assert sources.sources[0].source == "late.md"
        # A document without the shard field has no shard: the job says so, nothing changes.
        version = rl.index("years").version
        with pytest.raises(JobFailed) as failed:
            rl.upload("years", documents=[{"id": "nofield", "text": "No year here."}])
        assert failed.value.job.error is not None and failed.value.job.error.status == 422
        assert "year" in failed.value.job.error.message
        assert rl.index("years").version == version


def test_writes_to_one_shard_are_refused_with_the_way_to_make_them(sharded: Keyed) -> None:
    with Client(sharded.base, api_key=sharded.admin, retries=0) as rl:
        version = rl.index("years.shard-2022").version
        for write in (
            lambda: rl.upload("years.shard-2022", documents=[{"id": "x", "text": "some text"}]),
            lambda: rl.delete_document("years.shard-2022", "doc-3.md"),
            lambda: rl.delete_index("years.shard-2022"),
        ):
            with pytest.raises(Conflict) as refused:
                write()
            assert "shard of 'years'" in refused.value.message
            assert "ragline ingest PATH --index years --shard-by year" in refused.value.message
        assert rl.index("years.shard-2022").version == version
        # A new index may not take a shard's name.
        with pytest.raises(BadRequest) as named:
            rl.upload("fresh.shard-1", documents=[{"id": "x", "text": "some text"}])
        assert ".shard-" in named.value.message


def test_shard_values_past_the_limit_are_refused_at_the_door_or_fail_their_job(sharded: Keyed) -> None:
    text = "The lighthouse keeper paints the tower every fourth summer."
    with Client(sharded.base, api_key=sharded.admin, retries=0) as rl:
        for year in range(2030, 2030 + SHARD_LIMIT - (rl.index("years").shards or 0)):
            rl.upload("years", documents=[{"id": f"y{year}", "text": text, "metadata": {"year": str(year)}}])
        assert rl.index("years").shards == SHARD_LIMIT
        version = rl.index("years").version
        # Named by the upload's metadata: refused before anything is staged.
        with pytest.raises(Conflict) as door:
            rl.upload("years", documents=[{"id": "late", "text": text, "metadata": {"year": "2099"}}])
        assert f"the limit is {SHARD_LIMIT} (RAGLINE_MAX_SHARDS_PER_INDEX)" in door.value.message
        assert "'2099'" in door.value.message
        # Named by a file's front matter: its job fails the same way, and no shard changes.
        with pytest.raises(JobFailed) as failed:
            rl.upload("years", files=[("late.md", f"---\nyear: 2098\n---\n# Late\n\n{text}".encode())])
        error = failed.value.job.error
        assert error is not None and error.status == 409 and "RAGLINE_MAX_SHARDS_PER_INDEX" in error.message
        assert rl.index("years").shards == SHARD_LIMIT and rl.index("years").version == version


def test_deleting_a_sharded_index_removes_its_shards(sharded: Keyed) -> None:
    from ragline.broker.state import shards
    from ragline.broker.state.shards import hash_shard

    keys = Keys(sharded.settings.redis.key_prefix)
    root = Path(sharded.settings.indexes_dir)
    assert len(list(root.glob("hashed.shard-*"))) == len(_hash_keys() | {hash_shard("quill.md", 3)})
    with Client(sharded.base, api_key=sharded.admin, retries=0) as rl:
        job = rl.delete_index("hashed")
        assert job.status == "done" and job.result is not None
        assert job.result.removed == len(PLACES) + 1  # with quill.md
        with pytest.raises(NotFound):
            rl.index("hashed")
        for key in _hash_keys():
            with pytest.raises(NotFound):
                rl.index(f"hashed.shard-{key}")
        assert not [ix.name for ix in rl.indexes().indexes if ix.name.startswith("hashed")]
    registered = [n.decode() for n in sharded.redis.hkeys(keys.indexes)]
    assert not [n for n in registered if n.startswith("hashed")], registered
    assert shards.lookup(sharded.redis, keys, "hashed") is None
    assert not list(root.glob("hashed*")), list(root.glob("hashed*"))
    # Every document list of its shards expires (at once for the current versions'; a replaced
    # version's an hour after its swap, as for any index).
    lists = list(sharded.redis.scan_iter(f"{keys.prefix}:docids:hashed*"))
    assert all(sharded.redis.ttl(k) != -1 for k in lists), lists
    # The other sharded index is untouched.
    assert shards.lookup(sharded.redis, keys, "years") is not None
