"""The next version of an index (build.py), branch by branch: what is embedded again and what is
reused, what is refused and leaves the index as it was, a cancel at each step, a sharded index's
routing, and the removal of a deleted index's files.

Real Redis and FAISS on a small corpus; the encoder is a narrow fake (a vector per text, from
its hash), since what is tested is which texts reach it, not what it makes of them."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import psutil
import pytest
import redis
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.broker.contract.messages import IngestProgress, IngestResult
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards
from ragline.workers.ingest import build
from ragline.workers.ingest.build import Change, IngestCancelled, IngestRefused
from ragline.workers.ingest.reading import ReaderProcess
from ragline.workers.retrieval import index_files
from ragline.workers.retrieval.chunking import Chunk, ChunkShape
from ragline.workers.retrieval.sharded_ingest import register_sharded, split

pytestmark = pytest.mark.integration

DIM = 16


@dataclass
class FakeEmbedder:
    """What build asks of an Embedder; remembers every text it encoded."""

    dim: int = DIM
    model_id: str = "fake-hash-encoder"
    encoded: list[str] = field(default_factory=list)

    def encode(self, texts: list[str]) -> np.ndarray:
        self.encoded.extend(texts)
        rows = [
            np.random.default_rng(int(hashlib.sha1(t.encode()).hexdigest()[:8], 16)).random(DIM)
            for t in texts
        ]
        vectors = np.array(rows, dtype=np.float32).reshape(len(texts), DIM)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@dataclass
class Reports:
    """The progress an ingest reports; answers False (cancelled) from ``cancel_at`` on."""

    cancel_at: str | None = None
    seen: list[IngestProgress] = field(default_factory=list)
    act_at: str | None = None
    then: list[Callable[[], object]] = field(default_factory=list)  # run at ``act_at``

    def __call__(self, progress: IngestProgress) -> bool:
        self.seen.append(progress)
        if progress.phase == self.act_at:
            for act in self.then:
                act()
        return progress.phase != self.cancel_at

    @property
    def phases(self) -> list[str]:
        return list(dict.fromkeys(p.phase for p in self.seen))


@dataclass
class Env:
    settings: Settings
    client: redis.Redis
    keys: Keys
    embedder: FakeEmbedder

    def next_version(
        self, index: str, change: Change, report: Reports | None = None, *, index_type: str = "hnsw"
    ) -> IngestResult:
        return build.next_version(
            self.settings,
            self.client,
            self.keys,
            self.embedder,  # type: ignore[arg-type]
            index=index,
            change=change,
            report=report or Reports(),
            index_type=index_type,
        )

    def change_shards(self, index: str, change: Change, report: Reports | None = None) -> IngestResult:
        shard_map = shards.lookup(self.client, self.keys, index)
        assert shard_map is not None
        return build.change_shards(
            self.settings,
            self.client,
            self.keys,
            self.embedder,  # type: ignore[arg-type]
            shard_map=shard_map,
            change=change,
            report=report or Reports(),
        )

    def version(self, index: str) -> str | None:
        info = indexes.lookup(self.client, self.keys, index)
        return info.version if info else None

    def listed(self, index: str) -> set[str]:
        info = indexes.lookup(self.client, self.keys, index)
        assert info is not None
        ids = self.client.zrange(self.keys.document_ids(index, info.version), 0, -1)
        return {i.decode() for i in ids}


@pytest.fixture
def env(redis_url: str, tmp_path: Path) -> Iterator[Env]:
    prefix = f"ragline-test-build-{uuid.uuid4().hex[:8]}"
    settings = Settings().replace(redis_url=redis_url, home=tmp_path, key_prefix=prefix, ivf_pq_m=4)
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield Env(settings, client, Keys(prefix), FakeEmbedder())
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()


def doc(doc_id: str, chunks: int = 2, *, edition: int = 1, **meta: str) -> list[Chunk]:
    return [
        Chunk(
            chunk_id=f"{doc_id}#{i}",
            source=doc_id,
            title=f"{doc_id} part {i}",
            text=f"text {i} of {doc_id}, edition {edition}",
            meta={"path": doc_id, **meta},
        )
        for i in range(chunks)
    ]


def upload(*docs: list[Chunk]) -> Change:
    ids = [d[0].meta["path"] for d in docs]
    return Change(add=[c for d in docs for c in d], added_ids=ids, drop=frozenset(ids))


def delete(*ids: str) -> Change:
    return Change(add=[], added_ids=[], drop=frozenset(ids))


# -- next_version ---------------------------------------------------------------------------------


def test_a_new_index_is_built_listed_and_registered(env: Env) -> None:
    report = Reports()
    result = env.next_version("books", upload(doc("a"), doc("b", 3)), report)
    assert (result.documents, result.chunks, result.added, result.removed) == (2, 5, 2, 0)
    assert (result.embedded, result.reused) == (5, 0)
    assert env.version("books") == result.version and env.listed("books") == {"a", "b"}
    assert report.phases == ["embedding", "indexing", "registering"]


def test_the_next_version_embeds_only_what_changed_and_reuses_the_kept_vectors(env: Env) -> None:
    env.next_version("books", upload(doc("a"), doc("b")))
    env.embedder.encoded.clear()
    replaced_b = doc("b", 1, edition=2)  # what the encoder saw before comes from the cache
    result = env.next_version("books", upload(replaced_b, doc("c")))
    assert env.embedder.encoded == [c.embed_text for c in replaced_b + doc("c")]
    assert (result.embedded, result.reused, result.removed, result.added) == (3, 2, 1, 2)
    assert (result.documents, result.chunks) == (3, 5) and env.listed("books") == {"a", "b", "c"}


def test_an_ivfpq_index_keeps_codes_so_its_kept_chunks_are_embedded_again(env: Env) -> None:
    many = [doc(f"d{i}", 3) for i in range(15)]
    env.next_version("codes", upload(*many), index_type="ivfpq")
    result = env.next_version("codes", upload(doc("new")))
    assert indexes.lookup(env.client, env.keys, "codes").index_type == "ivfpq"  # type: ignore[union-attr]
    assert (result.embedded, result.reused, result.chunks) == (47, 0, 47)


def test_deleting_a_document_it_does_not_have_is_refused_and_changes_nothing(env: Env) -> None:
    first = env.next_version("books", upload(doc("a")))
    with pytest.raises(IngestRefused) as refused:
        env.next_version("books", delete("a", "zz"))
    assert refused.value.status == 404 and "no document 'zz'" in str(refused.value)
    assert env.version("books") == first.version


def test_a_change_that_leaves_no_document_is_refused(env: Env) -> None:
    first = env.next_version("books", upload(doc("a")))
    with pytest.raises(IngestRefused) as refused:
        env.next_version("books", delete("a"))
    assert refused.value.status == 409 and "without documents" in str(refused.value)
    assert env.version("books") == first.version


def test_a_sharded_index_is_refused_with_how_to_add_to_it(env: Env) -> None:
    _sharded(env, "shelf", [doc("a"), doc("b")], count=2)
    with pytest.raises(IngestRefused) as refused:
        env.next_version("shelf", upload(doc("c")))
    assert refused.value.status == 409 and "--shards 2" in str(refused.value)


@pytest.mark.parametrize("phase", ["embedding", "indexing"])
def test_a_cancel_before_the_swap_registers_nothing(env: Env, phase: str) -> None:
    first = env.next_version("books", upload(doc("a")))
    with pytest.raises(IngestCancelled):
        env.next_version("books", upload(doc("b")), Reports(cancel_at=phase))
    assert env.version("books") == first.version


def test_a_cancel_at_the_swap_undoes_the_saved_version(env: Env) -> None:
    first = env.next_version("books", upload(doc("a")))
    with pytest.raises(IngestCancelled):
        env.next_version("books", upload(doc("b")), Reports(cancel_at="registering"))
    assert env.version("books") == first.version
    folder = env.settings.indexes_dir / "books"
    assert (folder / "CURRENT").read_text() == first.version
    left = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert left == {"CURRENT", first.version}


def test_an_index_replaced_while_it_ran_is_refused_and_its_version_undone(env: Env) -> None:
    env.next_version("books", upload(doc("a")))
    registered = indexes.lookup(env.client, env.keys, "books")
    assert registered is not None
    report = Reports(act_at="indexing")
    # Another ingest registers its version meanwhile.
    other = registered.model_copy(update={"version": "other-version"})
    report.then.append(lambda: indexes.register(env.client, env.keys, other))
    with pytest.raises(IngestRefused) as refused:
        env.next_version("books", upload(doc("b")), report)
    assert refused.value.status == 409 and "replaced while this ran" in str(refused.value)
    assert env.version("books") == "other-version"


# -- change_shards --------------------------------------------------------------------------------


def _sharded(
    env: Env, index: str, docs: list[list[Chunk]], *, count: int | None = None, shard_by: str | None = None
) -> shards.ShardMap:
    """A sharded index as `ragline ingest --shards` makes it: each shard an index of its own."""
    parts = split([c for d in docs for c in d], index=index, count=count, shard_by=shard_by)
    for key, chunks in parts.items():
        ids = list(dict.fromkeys(c.meta["path"] for c in chunks))
        change = Change(add=chunks, added_ids=ids, drop=frozenset(ids))
        env.next_version(shards.shard_index(index, key), change)
    shard_map = shards.ShardMap(index=index, shard_by=shard_by, keys=tuple(sorted(parts)), count=count)
    index_files.write_shard_map(env.settings.indexes_dir, shard_map)
    register_sharded(env.client, env.keys, env.settings.indexes_dir, shard_map)
    return shard_map


def test_an_upload_goes_to_its_shard_and_the_other_shards_stay_as_they_are(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023"), doc("y", year="2024")], shard_by="year")
    before = {k: env.version(shards.shard_index("shelf", k)) for k in ("2023", "2024")}
    logical = env.version("shelf")
    result = env.change_shards("shelf", upload(doc("z", year="2024")))
    assert env.version("shelf.shard-2023") == before["2023"]
    assert env.version("shelf.shard-2024") != before["2024"]
    assert env.listed("shelf.shard-2024") == {"y", "z"}
    assert result.version == env.version("shelf") != logical and result.added == 1


def test_a_new_field_value_grows_the_map(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023")], shard_by="year")
    env.change_shards("shelf", upload(doc("w", year="2025")))
    grown = shards.lookup(env.client, env.keys, "shelf")
    assert grown is not None and grown.keys == ("2023", "2025")
    on_disk = {m.index: m for m in index_files.shard_maps_on_disk(env.settings.indexes_dir)}
    assert on_disk["shelf"].keys == ("2023", "2025")


def test_a_document_without_the_shard_field_is_refused(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023")], shard_by="year")
    with pytest.raises(IngestRefused) as refused:
        env.change_shards("shelf", upload(doc("nofield")))
    assert refused.value.status == 422 and "'year'" in str(refused.value)


def test_a_map_without_its_shard_count_cannot_place_an_upload(env: Env) -> None:
    shard_map = _sharded(env, "shelf", [doc("a"), doc("b")], count=2)
    legacy = shards.ShardMap(index="shelf", shard_by=None, keys=shard_map.keys, count=None)
    shards.register(
        env.client,
        env.keys,
        legacy,
        indexes.lookup(env.client, env.keys, "shelf"),  # type: ignore[arg-type]
    )
    with pytest.raises(IngestRefused) as refused:
        env.change_shards("shelf", upload(doc("c")))
    assert refused.value.status == 409 and "--shards N" in str(refused.value)
    env.change_shards("shelf", delete("a"))  # a delete needs no routing: still served


def test_a_delete_changes_only_the_shards_listing_it(env: Env) -> None:
    _sharded(
        env, "shelf", [doc("x", year="2023"), doc("x2", year="2023"), doc("y", year="2024")], shard_by="year"
    )
    before = env.version("shelf.shard-2024")
    result = env.change_shards("shelf", delete("x"))
    assert env.listed("shelf.shard-2023") == {"x2"} and env.version("shelf.shard-2024") == before
    assert result.removed == 1


def test_a_delete_of_what_no_shard_lists_is_refused(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023")], shard_by="year")
    with pytest.raises(IngestRefused) as refused:
        env.change_shards("shelf", delete("nowhere"))
    assert refused.value.status == 404


def test_a_delete_that_would_empty_a_shard_is_refused(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023"), doc("y", year="2024")], shard_by="year")
    before = env.version("shelf")
    with pytest.raises(IngestRefused) as refused:
        env.change_shards("shelf", delete("x"))
    assert refused.value.status == 409 and "shelf.shard-2023" in str(refused.value)
    assert env.version("shelf") == before


# -- remove ---------------------------------------------------------------------------------------


def test_removing_a_deleted_index_takes_its_files(env: Env) -> None:
    first = env.next_version("books", upload(doc("a"), doc("b")))
    assert indexes.unregister(env.client, env.keys, "books", version=first.version)  # the API's delete
    result = build.remove(env.settings, env.client, env.keys, index="books", version=first.version)
    assert result.removed == 2 and not (env.settings.indexes_dir / "books").exists()


def test_an_index_made_again_since_keeps_its_new_version(env: Env) -> None:
    first = env.next_version("books", upload(doc("a")))
    second = env.next_version("books", upload(doc("b")))
    build.remove(env.settings, env.client, env.keys, index="books", version=first.version)
    folder = env.settings.indexes_dir / "books"
    assert (folder / second.version).is_dir() and not (folder / first.version).exists()
    assert env.version("books") == second.version


def test_removing_a_sharded_index_takes_every_shard_and_its_map(env: Env) -> None:
    shard_map = _sharded(env, "shelf", [doc("x", year="2023"), doc("y", year="2024")], shard_by="year")
    env.client.hdel(env.keys.indexes, "shelf")  # the API's delete of the logical entry
    result = build.remove(env.settings, env.client, env.keys, index="shelf", version=None)
    assert result.removed == 2
    assert shards.lookup(env.client, env.keys, "shelf") is None
    assert all(env.version(s) is None for s in shard_map.shards)
    assert not any(env.settings.indexes_dir.iterdir())


def test_a_sharded_index_made_again_since_is_left_alone(env: Env) -> None:
    _sharded(env, "shelf", [doc("x", year="2023")], shard_by="year")
    result = build.remove(env.settings, env.client, env.keys, index="shelf", version=None)
    assert result.removed == 0 and env.version("shelf.shard-2023") is not None


# -- staged_chunks --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reader() -> Iterator[ReaderProcess]:
    """The reader the ingest worker uses: a child process, each document within its limit."""
    child = ReaderProcess(timeout_s=60)
    yield child
    child.close()


def _staged(retrieval: RetrievalSettings, folder: Path, reader: ReaderProcess) -> Change:
    return build.staged_chunks(retrieval, folder, reader, Reports())


def test_an_upload_is_read_under_its_ids_and_an_empty_document_is_refused(
    env: Env, tmp_path: Path, reader: ReaderProcess
) -> None:
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "0.md").write_text("# Tea\n\nUse water at about 80 degrees and steep for two minutes.\n")
    (folder / "1.txt").write_text("   \n")
    manifest = {"documents": [{"id": "tea", "file": "0.md", "metadata": {"shelf": "kitchen"}}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    change = _staged(env.settings.retrieval, folder, reader)
    assert change.added_ids == ["tea"] and change.drop == frozenset({"tea"})
    assert {c.meta["path"] for c in change.add} == {"tea"} and change.add[0].meta["shelf"] == "kitchen"

    manifest["documents"].append({"id": "blank", "file": "1.txt", "metadata": {}})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IngestRefused) as refused:
        _staged(env.settings.retrieval, folder, reader)
    assert refused.value.status == 422 and "'blank'" in str(refused.value)


def test_a_documents_front_matter_and_metadata_are_checked_against_the_limits(
    env: Env, tmp_path: Path, reader: ReaderProcess
) -> None:
    """The API checked the upload's metadata; merged with the front matter, only the ingest can."""
    folder = tmp_path / "upload"
    folder.mkdir()
    fields = "".join(f"k{i}: v\n" for i in range(5))
    (folder / "0.md").write_text(f"---\n{fields}---\n# Tea\n\nSteep for two minutes.\n")
    (folder / "1.md").write_text(f"---\nnote: {'x' * 4000}\n---\n# Tea\n\nSteep for two minutes.\n")
    (folder / "2.md").write_text("# Tea\n\nSteep for two minutes.\n")
    retrieval = env.settings.replace(metadata_max_keys=6, metadata_max_bytes=3000).retrieval
    cases = [
        ("0.md", {"shelf": "kitchen", "team": "t"}, 422, "RAGLINE_METADATA_MAX_KEYS"),  # 5 + 2
        ("1.md", {}, 422, "RAGLINE_METADATA_MAX_VALUE_CHARS"),
        (
            "2.md",
            {"shelf": "k" * 1000, "team": "t" * 1000, "more": "m" * 1000},
            413,
            "RAGLINE_METADATA_MAX_BYTES",
        ),
    ]
    for file, metadata, status, setting in cases:
        manifest = {"documents": [{"id": "tea", "file": file, "metadata": metadata}]}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(IngestRefused) as refused:
            _staged(retrieval, folder, reader)
        assert refused.value.status == status and setting in str(refused.value), str(refused.value)
        assert "'tea'" in str(refused.value)


def test_an_upload_that_would_pass_the_shard_limit_is_refused_and_changes_nothing(env: Env) -> None:
    _sharded(env, "shelf", [doc("a", year="2022"), doc("b", year="2023")], shard_by="year")
    limited = replace(env, settings=env.settings.replace(max_shards_per_index=3))
    limited.change_shards("shelf", upload(doc("c", year="2024")))  # the third: within the limit
    before = {s: env.version(s) for s in ("shelf", "shelf.shard-2022", "shelf.shard-2024")}
    with pytest.raises(IngestRefused) as refused:
        limited.change_shards("shelf", upload(doc("d", year="2025"), doc("e", year="2022")))
    assert refused.value.status == 409
    assert "the limit is 3 (RAGLINE_MAX_SHARDS_PER_INDEX)" in str(refused.value) and "'2025'" in str(
        refused.value
    )
    assert {s: env.version(s) for s in before} == before and env.version("shelf.shard-2025") is None


def test_an_uploads_titles_and_chunks_are_capped_as_the_settings_say(
    env: Env, tmp_path: Path, reader: ReaderProcess
) -> None:
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "0.md").write_text(f"# {'H' * 16_384}\n\n## Steeping\n\n{'x' * 300_011}\n")
    (folder / "manifest.json").write_text(json.dumps({"documents": [{"id": "tea", "file": "0.md"}]}))
    retrieval = env.settings.replace(
        chunk_max_chars=5000, title_max_chars=100, title_path_max_chars=150
    ).retrieval
    change = _staged(retrieval, folder, reader)
    assert len(change.add) == 61 and all(len(c.text) <= 5000 for c in change.add)
    assert {c.title for c in change.add} == {"H" * 99 + "… › Steeping"}
    assert len({id(c.meta) for c in change.add}) == 1


def _upload_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    """A staged upload: each file a document of the same id (its name without the type)."""
    folder = tmp_path / "upload"
    folder.mkdir(parents=True)
    for name, body in files.items():
        (folder / name).write_text(body)
    manifest = {"documents": [{"id": name.split(".")[0], "file": name} for name in files]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


# Seconds to read and chunk on any machine here (an eighth of it took 0.4 s on the fastest, quiet),
# where a short document takes milliseconds.
SLOW_TEXT = ("steep the leaves " * 60 + "\n\n") * 96_000


def test_a_document_past_its_time_limit_fails_alone_and_the_rest_is_read(env: Env, tmp_path: Path) -> None:
    tea = "# Tea\n\nUse water at about 80 degrees and steep for two minutes.\n"
    folder = _upload_folder(
        tmp_path, {"tea.md": tea, "slow.txt": SLOW_TEXT, "mint.md": tea.replace("Tea", "Mint")}
    )
    quick = ReaderProcess(timeout_s=0.5)
    try:
        change = build.staged_chunks(env.settings.retrieval, folder, quick, Reports())
        assert change.added_ids == ["tea", "mint"] and change.drop == frozenset({"tea", "mint"})
        assert [f.id for f in change.failed] == ["slow"]
        reason = change.failed[0].reason
        assert (
            "0.5 s" in reason
            and "RAGLINE_INGEST_DOCUMENT_TIMEOUT_S" in reason
            and str(tmp_path) not in reason
        )
        # The child that read the rest yields the CPU to everything else on the host.
        assert quick.pid is not None and psutil.Process(quick.pid).nice() > psutil.Process().nice()

        only_slow = _upload_folder(tmp_path / "again", {"slow.txt": SLOW_TEXT})
        with pytest.raises(IngestRefused) as refused:
            build.staged_chunks(env.settings.retrieval, only_slow, quick, Reports())
        assert refused.value.status == 422 and "'slow'" in str(refused.value)
    finally:
        quick.close()


def test_a_reader_stopped_mid_document_cancels_the_ingest_at_once(env: Env, tmp_path: Path) -> None:
    """What the watch thread does on a cancel or at the job's limit: the parse is killed."""
    folder = _upload_folder(tmp_path, {"slow.txt": SLOW_TEXT})
    patient = ReaderProcess(timeout_s=600)
    (tmp_path / "warm.md").write_text("# Warm\n\nThe child starts before the timed read.\n")
    shape = ChunkShape.of(env.settings.retrieval)
    assert patient.read(tmp_path / "warm.md", source="warm", metadata={}, shape=shape)
    stopper = threading.Timer(0.5, patient.stop)
    began = time.monotonic()
    stopper.start()
    try:
        with pytest.raises(IngestCancelled):
            build.staged_chunks(env.settings.retrieval, folder, patient, Reports())
        assert time.monotonic() - began < 3
    finally:
        stopper.cancel()
        patient.close()
