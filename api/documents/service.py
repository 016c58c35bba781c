"""Documents over HTTP: uploads staged on disk, each write to an index a job on the ``ingest`` queue.

An upload's bytes go to a folder of its own under ``Settings.uploads_dir`` (the volume the API
and the workers share: one host's home folder, or the data volume in compose and Kubernetes),
never into Redis, whose memory holds the queues, the door and the caches; the task names the
folder. The folder is complete (written aside, renamed) before the job exists, and the job
exists before its task is queued (in its API key's line, ``broker/state/ingest_turns.py``, with
a turn sent), so an accepted upload is never lost: a worker that dies mid-ingest stops renewing
its job's lease, and the job runs again from the same folder.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from ragline.api.documents.protocol import DocumentsUpload
from ragline.api.errors import ApiError, invalid
from ragline.api.jobs.protocol import JobAccepted
from ragline.api.jobs.service import checked_webhook, status_url
from ragline.broker.config.settings import (
    ApiSettings,
    JobSettings,
    RedisSettings,
    RetrievalSettings,
    WebhookSettings,
)
from ragline.broker.contract.messages import (
    DOCUMENT_SUFFIXES,
    IngestOperation,
    IngestTask,
    IngestTurn,
    QueuedIngest,
    StagedDocument,
    UploadManifest,
    document_type,
)
from ragline.broker.contract.queues import INGEST_QUEUE, INGEST_TURN_TASK
from ragline.broker.contract.records import IndexInfo, IngestRequest
from ragline.broker.limits.metadata import (
    MetadataLimits,
    MetadataRefused,
    check_metadata,
    parse_metadata_json,
)
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys, documents, indexes, ingest_turns, jobs, shards
from starlette.datastructures import UploadFile

_MAX_ID_CHARS = 256
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# A staged file's name keeps this much of its document's name (a headless text's title comes from
# it), well under the file system's 255 bytes with a folder number and a suffix around it.
_STAGED_STEM_CHARS = 200

# Enqueue one task: (queue, task name, kwargs, kwargsrepr).
Send = Callable[..., Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Incoming:
    """One document of an upload before it is staged: its id, name on disk, and how to get its bytes."""

    id: str
    name: str
    metadata: dict[str, str]
    write: Callable[[Path], None]


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def _refused(exc: MetadataRefused) -> ApiError:
    return ApiError(exc.status, "too_large" if exc.status == 413 else "invalid_request", exc.message)


def check_document_id(doc_id: str) -> str:
    if not 1 <= len(doc_id) <= _MAX_ID_CHARS or not doc_id.isprintable():
        raise _invalid(f"document id {doc_id[:80]!r} must be 1..{_MAX_ID_CHARS} printable characters")
    return doc_id


def check_file_type(name: str) -> str:
    """The type the file ``name`` is read as: 422 for a name with none before its type, 415 for
    a type ragline does not read."""
    kind = document_type(name)
    if kind is not None:
        return kind
    suffix = max((s for s in DOCUMENT_SUFFIXES if name.lower().endswith(s)), key=len, default=None)
    if suffix is not None:
        raise _invalid(f"file name {name!r} has no name before its type (e.g. notes{suffix})")
    raise ApiError(
        415,
        "unsupported_media_type",
        f"{name[:80]!r} is not a type ragline reads: use {', '.join(DOCUMENT_SUFFIXES)}",
    )


def _staged_name(stem: str, kind: str) -> str:
    """A file name for the staging folder: ``stem``'s safe characters (a headless text's title),
    cut to a length every file system takes, and the type it is read as."""
    safe = _UNSAFE.sub("_", stem).lstrip(".")[:_STAGED_STEM_CHARS] or "document"
    if document_type(safe + kind) != kind:  # a JSON document "notes.rst" of format txt
        safe = safe.replace(".", "_")
    return safe + kind


def check_index(name: str) -> str:
    if not indexes.valid_index_name(name):
        raise ApiError(400, "invalid_request", f"index must be {indexes.INDEX_NAME_RULE}")
    return name


def check_write(scopes: tuple[str, ...], index: str) -> None:
    """403 unless a key with ``scopes`` may change ``index``."""
    if not apikeys.may_write(scopes, index):
        held = ", ".join(scopes) or "none"
        raise ApiError(
            403,
            "forbidden",
            f"this API key may not change index {index!r} (its scopes: {held}); a key with scope "
            f"admin or write:{index} may (ragline keys create --scope write:{index})",
        )


class DocumentService:
    def __init__(
        self,
        settings: ApiSettings,
        webhooks: WebhookSettings,
        redis_settings: RedisSettings,
        job_settings: JobSettings,
        *,
        uploads_dir: Path,
        redis: aioredis.Redis,
        send: Send,
        retrieval: RetrievalSettings,
    ) -> None:
        self._settings = settings
        self._metadata = MetadataLimits.of(retrieval)
        self._max_shards = retrieval.max_shards_per_index
        self._webhooks = webhooks
        self._uploads_dir = uploads_dir
        self._redis = redis
        self._send = send
        self._keys = Keys(redis_settings.key_prefix)
        self._store = jobs.AsyncJobStore(redis, redis_settings, job_settings)

    # -- reading an upload -----------------------------------------------------------------

    def _check_count(self, count: int) -> None:
        limit = self._settings.upload_max_documents
        if count == 0:
            raise _invalid('no documents: send files (multipart/form-data) or {"documents": [...]}')
        if count > limit:
            raise _invalid(
                f"{count} documents in one upload; the limit is {limit} (RAGLINE_UPLOAD_MAX_DOCUMENTS)"
            )

    @staticmethod
    def _check_unique(found: list[Incoming]) -> None:
        seen: set[str] = set()
        for doc in found:
            if doc.id in seen:
                raise _invalid(f"document id {doc.id!r} appears twice in this upload")
            seen.add(doc.id)

    def from_json(self, body: bytes) -> tuple[list[Incoming], str | None]:
        try:
            upload = DocumentsUpload.model_validate_json(body)
        except ValidationError as exc:
            raise invalid(list(exc.errors())) from None
        self._check_count(len(upload.documents))
        found = []
        for i, doc in enumerate(upload.documents):
            check_document_id(doc.id)
            if not doc.text.strip():
                raise _invalid(f"document {doc.id!r} has no text")
            try:
                metadata = check_metadata(
                    doc.metadata, self._metadata, what=f"the metadata of document {doc.id!r}"
                )
            except MetadataRefused as exc:
                raise _refused(exc) from None
            data = doc.text.encode()
            staged = f"{i}/{_staged_name(doc.id, '.' + doc.format)}"
            found.append(Incoming(doc.id, staged, metadata, _writer(data)))
        self._check_unique(found)
        return found, upload.webhook_url

    def from_form(self, form: Any) -> tuple[list[Incoming], str | None]:
        metadata = _form_metadata(form.get("metadata"), self._metadata)
        webhook = form.get("webhook_url")
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        self._check_count(len(files))
        found = []
        for i, upload in enumerate(files):
            name = PurePosixPath((upload.filename or "").replace("\\", "/")).name
            if not name:
                raise _invalid(f"file part {i + 1} has no file name (its name is its document id)")
            check_document_id(name)
            kind = check_file_type(name)
            staged = f"{i}/{_staged_name(name[: -len(kind)], kind)}"
            found.append(Incoming(name, staged, metadata, _copier(upload)))
        self._check_unique(found)
        return found, webhook if isinstance(webhook, str) and webhook else None

    # -- writes: each one a job ------------------------------------------------------------

    async def upload(
        self, index: str, found: list[Incoming], *, principal: str, webhook_url: str | None
    ) -> JobAccepted:
        """Stage ``found`` and start the job that adds (or replaces) them."""
        webhook = await checked_webhook(self._webhooks, webhook_url) if webhook_url else None
        await self._check_shard_room(index, found)
        job_id = uuid.uuid4().hex
        root = self._uploads_dir
        await asyncio.to_thread(_stage, root, job_id, found)
        try:
            return await self._start(
                job_id,
                principal,
                IngestTask(
                    job_id=job_id, index=index, operation="add", staging=job_id, enqueued_at=time.time()
                ),
                documents=[d.id for d in found],
                webhook=webhook,
            )
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, root / job_id, True)
            raise

    async def check_upload(self, index: str) -> None:
        """Before the body is read: 409 for an upload into one shard, or into a sharded index whose
        documents cannot be routed (sharded by hash before its count was recorded); 400 for a new
        index named as a shard."""
        await self._refuse_shard(index)
        info = await indexes.alookup(self._redis, self._keys, index)
        if info is None and shards.SHARD_MARK in index:
            message = f"index name {index!r} is not valid: {shards.SHARD_MARK!r} is kept for shards"
            raise ApiError(400, "invalid_request", message)
        if info is None or info.index_type != shards.SHARDED_TYPE:
            return
        shard_map = await shards.alookup(self._redis, self._keys, index)
        if shard_map is not None and shard_map.shard_by is None and shard_map.count is None:
            raise ApiError(
                409,
                "shard_count_unknown",
                f"index {index!r} was sharded by hash before its shard count was recorded, so an "
                f"upload cannot be routed to its shards: ingest the documents once with `ragline "
                f"ingest PATH --index {index} --shards N`, N the count it was made with",
            )

    async def _check_shard_room(self, index: str, found: list[Incoming]) -> None:
        """409 when the upload's metadata gives the index's shard field values that would make
        more shards than RAGLINE_MAX_SHARDS_PER_INDEX. A value from a file's front matter is
        known only to the ingest, whose job then fails the same way."""
        shard_map = await shards.alookup(self._redis, self._keys, index)
        if shard_map is None or shard_map.shard_by is None:
            return
        field = shard_map.shard_by
        values = {d.metadata[field] for d in found if d.metadata.get(field)}
        try:
            shards.check_shard_count(index, shard_map.keys, values, limit=self._max_shards)
        except shards.TooManyShards as exc:
            raise ApiError(409, "too_many_shards", str(exc)) from None

    async def _refuse_shard(self, index: str) -> None:
        """409 for a write addressed to one shard: it would change the shard under its sharded
        index's entry, whose version (and so the result cache) would not follow."""
        shard_map = await shards.ashard_of(self._redis, self._keys, index)
        if shard_map is None:
            return
        raise ApiError(
            409,
            "shard_of_index",
            f"index {index!r} is a shard of {shard_map.index!r}: write to {shard_map.index!r}, which "
            f"routes each document to its shard (/v1/indexes/{shard_map.index}/documents), or "
            f"re-ingest the shard's documents with `ragline ingest PATH {shards.rerun_hint(shard_map)}`",
        )

    async def delete_document(self, index: str, doc_id: str, *, principal: str) -> JobAccepted:
        await self._refuse_shard(index)
        info = await self._current(index)
        if info.index_type == shards.SHARDED_TYPE:
            # The job deletes it from each shard listing it, and registers the index again.
            versions = await self._shard_versions(info)
            if not await documents.aholders(self._redis, self._keys, versions, doc_id):
                listed = await documents.apage_merged(self._redis, self._keys, versions, after=None, limit=1)
                if listed is None:
                    raise _not_listed(info)
                raise ApiError(404, "unknown_document", f"index {index!r} has no document {doc_id!r}")
        elif await documents.aget(self._redis, self._keys, index, info.version, doc_id) is None:
            if await documents.acount(self._redis, self._keys, index, info.version) == 0:
                raise _not_listed(info)
            raise ApiError(404, "unknown_document", f"index {index!r} has no document {doc_id!r}")
        task = IngestTask(
            job_id=uuid.uuid4().hex,
            index=index,
            operation="delete_documents",
            document_ids=[doc_id],
            enqueued_at=time.time(),
        )
        return await self._start(task.job_id, principal, task, documents=[doc_id], webhook=None)

    async def delete_index(self, index: str, *, principal: str) -> JobAccepted:
        """Gone from queries at once (404 from now on); a job removes its files (a sharded
        index's: every shard's, and its map)."""
        await self._refuse_shard(index)
        info = await indexes.aunregister(self._redis, self._keys, index)
        if info is None:
            raise _unknown_index(index)
        task = IngestTask(
            job_id=uuid.uuid4().hex,
            index=index,
            operation="delete_index",
            version=info.version,
            enqueued_at=time.time(),
        )
        try:
            return await self._start(task.job_id, principal, task, documents=[], webhook=None)
        except BaseException:
            # Nothing will remove its files: it stays, as if the delete had not been asked.
            await indexes.aregister(self._redis, self._keys, info)
            raise

    async def _start(
        self,
        job_id: str,
        principal: str,
        task: IngestTask,
        *,
        documents: list[str],
        webhook: str | None,
    ) -> JobAccepted:
        operation: IngestOperation = task.operation
        record = jobs.new_ingest_record(
            job_id=job_id,
            owner=principal,
            request=IngestRequest(index=task.index, operation=operation, documents=documents),
            webhook_url=webhook,
            now=time.time(),
        )
        await self._store.create(record, idempotency=None)
        # The job waits in its key's list; the turn it sends runs whichever key's turn it is.
        queued = QueuedIngest(key=principal, task=task)
        try:
            await ingest_turns.apush(self._redis, self._keys, queued)
            try:
                turn = IngestTurn(enqueued_at=task.enqueued_at)
                await self._send(
                    INGEST_QUEUE, INGEST_TURN_TASK, turn.encode(), kwargsrepr=f"{{'job_id': {job_id!r}}}"
                )
                # On the replicas with its place in line, or undone and 503.
                await self._store.confirm(job_id, idempotency=None)
            except BaseException:
                await ingest_turns.awithdraw(self._redis, self._keys, queued)
                raise
        except BaseException:
            await self._store.discard(job_id, idempotency=None)
            raise
        return JobAccepted(job_id=job_id, status="queued", status_url=status_url(job_id))

    # -- reads -----------------------------------------------------------------------------

    async def _current(self, index: str) -> IndexInfo:
        info = await indexes.alookup(self._redis, self._keys, index)
        if info is None:
            raise _unknown_index(index)
        return info

    async def _shard_versions(self, info: IndexInfo) -> list[tuple[str, str]]:
        """(shard, version) of each registered shard of the sharded index ``info``."""
        shard_map = await shards.alookup(self._redis, self._keys, info.name)
        if shard_map is None:
            raise _unknown_index(info.name)  # deleted between the two reads
        found = await indexes.alookup_many(self._redis, self._keys, list(shard_map.shards))
        return [(i.name, i.version) for i in found if i is not None]

    async def page(self, index: str, *, after: str | None, limit: int) -> dict[str, Any]:
        page_max = self._settings.documents_page_max
        if not 1 <= limit <= page_max:
            raise ApiError(400, "invalid_request", f"limit must be between 1 and {page_max}, got {limit}")
        info = await self._current(index)
        if info.index_type == shards.SHARDED_TYPE:
            versions = await self._shard_versions(info)
            found = await documents.apage_merged(self._redis, self._keys, versions, after=after, limit=limit)
            total = await documents.acount_merged(self._redis, self._keys, versions)
        else:
            found = await documents.apage(
                self._redis, self._keys, index, info.version, after=after, limit=limit
            )
            total = await documents.acount(self._redis, self._keys, index, info.version)
        if found is None:
            raise _not_listed(info)
        entries, next_after = found
        return {
            "index": index,
            "version": info.version,
            "total": total,
            "documents": [
                {"id": e.id, "title": e.title, "path": e.path, "chunks": e.chunks} for e in entries
            ],
            "next_after": next_after,
        }


def _unknown_index(index: str) -> ApiError:
    return ApiError(404, "unknown_index", f"index {index!r} does not exist; ingest it first")


def _not_listed(info: IndexInfo) -> ApiError:
    return ApiError(
        503,
        "documents_not_listed",
        f"index {info.name!r} version {info.version} has no list of documents yet: a retrieval "
        "worker lists it when it starts; retry shortly",
        headers={"Retry-After": "5"},
    )


def _form_metadata(raw: object, limits: MetadataLimits) -> dict[str, str]:
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        raise _invalid('metadata must be a JSON object of strings, e.g. {"team": "docs"}')
    try:
        return parse_metadata_json(raw, limits, what="metadata")
    except MetadataRefused as exc:
        raise _refused(exc) from None


def _writer(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _copier(upload: UploadFile) -> Callable[[Path], None]:
    def copy(path: Path) -> None:
        upload.file.seek(0)
        with path.open("wb") as out:
            shutil.copyfileobj(upload.file, out, 1 << 20)

    return copy


def _stage(root: Path, job_id: str, found: list[Incoming]) -> None:
    """The upload's folder, written aside and renamed whole into place."""
    partial = root / f".{job_id}.partial"
    (partial / "files").mkdir(parents=True)
    try:
        staged = []
        for doc in found:
            path = partial / "files" / doc.name
            path.parent.mkdir(parents=True, exist_ok=True)
            doc.write(path)
            staged.append(StagedDocument(id=doc.id, file=f"files/{doc.name}", metadata=doc.metadata))
        (partial / "manifest.json").write_text(UploadManifest(documents=staged).encode())
        partial.rename(root / job_id)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
