"""An index's documents over HTTP: upload (202 + job), list, delete one (202 + job), delete the index."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from ragline.api.deps import principal_of
from ragline.api.documents.protocol import DocumentList, DocumentsUpload
from ragline.api.documents.service import DocumentService, check_document_id, check_index, check_write
from ragline.api.errors import ApiError
from ragline.api.jobs.protocol import JobAccepted
from ragline.api.query.protocol import ErrorBody, body_schema

router = APIRouter(prefix="/v1", tags=["documents"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
}
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "metadata": {
                            "type": "string",
                            "description": "JSON object of strings, on every file",
                        },
                        "webhook_url": {"type": "string"},
                    },
                    "required": ["files"],
                }
            },
            "application/json": {"schema": body_schema(DocumentsUpload)},
        },
    }
}


def _service(request: Request) -> DocumentService:
    return request.app.state.document_service


def _scopes(request: Request) -> tuple[str, ...]:
    return tuple(getattr(request.state, "scopes", ()))


def _accepted(response: Response, accepted: JobAccepted) -> JobAccepted:
    response.headers["Location"] = accepted.status_url
    return accepted


@router.post(
    "/indexes/{name}/documents",
    status_code=202,
    response_model=JobAccepted,
    responses=_ERRORS,
    openapi_extra=_UPLOAD_BODY,
)
async def upload_documents(name: str, request: Request, response: Response) -> JobAccepted:
    """Add documents to ``name`` (made on the first upload), replacing those with the same ids:
    files (multipart, the types `ragline ingest` reads, each file's name its id) or JSON
    documents. A job builds the next version; poll ``status_url`` for its progress."""
    check_index(name)
    check_write(_scopes(request), name)
    service = _service(request)
    await service.check_upload(name)
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        limit = request.app.state.settings.api.upload_max_documents
        async with request.form(max_files=limit + 1, max_fields=limit + 16) as form:
            found, webhook = service.from_form(form)
            accepted = await service.upload(name, found, principal=principal_of(request), webhook_url=webhook)
    elif kind == "application/json":
        found, webhook = service.from_json(await request.body())
        accepted = await service.upload(name, found, principal=principal_of(request), webhook_url=webhook)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send files as multipart/form-data, or documents as application/json",
        )
    return _accepted(response, accepted)


@router.get("/indexes/{name}/documents", response_model=DocumentList, responses=_ERRORS)
async def list_documents(
    name: str,
    request: Request,
    after: str | None = Query(default=None, description="The `next_after` of the previous page."),
    limit: int = Query(default=100, description="At most this many (up to RAGLINE_DOCUMENTS_PAGE_MAX)."),
) -> DocumentList:
    """The documents of the version queries use, in id order, a page at a time (a sharded
    index's: every shard's, as one list)."""
    check_index(name)
    return DocumentList.model_validate(await _service(request).page(name, after=after, limit=limit))


@router.delete(
    "/indexes/{name}/documents/{doc_id:path}", status_code=202, response_model=JobAccepted, responses=_ERRORS
)
async def delete_document(name: str, doc_id: str, request: Request, response: Response) -> JobAccepted:
    """Drop one document: a job builds the next version without it (queries see it until then);
    in a sharded index, of the shard that holds it."""
    check_index(name)
    check_write(_scopes(request), name)
    check_document_id(doc_id)
    accepted = await _service(request).delete_document(name, doc_id, principal=principal_of(request))
    return _accepted(response, accepted)


@router.delete("/indexes/{name}", status_code=202, response_model=JobAccepted, responses=_ERRORS)
async def delete_index(name: str, request: Request, response: Response) -> JobAccepted:
    """Delete the index: queries answer 404 at once; a job removes its files (a sharded index's:
    every shard's)."""
    check_index(name)
    check_write(_scopes(request), name)
    accepted = await _service(request).delete_index(name, principal=principal_of(request))
    return _accepted(response, accepted)
