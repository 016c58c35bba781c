"""The validate step's checks (no I/O): the body against its model, the query against the server's
bounds, the deadline; each refusal a 4xx naming what is wrong."""

from __future__ import annotations

from pydantic import ValidationError

from api.errors import ApiError, invalid
from api.pipeline.context import Query, R
from api.protocol import QueryRequest
from broker import indexes
from broker.settings import ApiSettings, RetrievalSettings


def json_content(content_type: str | None) -> bool:
    """Whether a body of this type is read as JSON: none given, ``*/json`` or ``*/*+json``."""
    if content_type is None:
        return True
    subtype = content_type.split(";", 1)[0].strip().lower().partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


def parse_body(body: bytes, model: type[R], content_type: str | None) -> R:
    """The body as ``model``: 400 when it is not JSON, 422 naming each field that is wrong."""
    if not json_content(content_type):
        raise _invalid("the body must be JSON (Content-Type: application/json)")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise invalid(list(exc.errors())) from None  # type: ignore[arg-type]


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def _bounded(name: str, value: int | None, upper: int) -> int | None:
    if value is not None and not 1 <= value <= upper:
        raise _invalid(f"{name} must be between 1 and {upper}, got {value}")
    return value


def query_of(req: QueryRequest, s: ApiSettings, retrieval: RetrievalSettings) -> Query:
    """The request's query with the server's defaults filled in, within the server's bounds."""
    text = req.query.strip()
    if not text:
        raise _invalid("query must not be empty")
    size = len(text.encode())
    if size > s.max_query_bytes:
        raise _invalid(f"query is {size} bytes; the limit is {s.max_query_bytes}")
    top_k = s.default_top_k if req.top_k is None else req.top_k
    if not 1 <= top_k <= s.max_top_k:
        raise _invalid(f"top_k must be between 1 and {s.max_top_k}, got {top_k}")
    index = req.index or retrieval.default_index
    if not indexes.valid_index_name(index):
        raise _invalid(f"index must be {indexes.INDEX_NAME_RULE}")
    return Query(
        query=text,
        top_k=top_k,
        mode=req.mode,
        index=index,
        ef_search=_bounded("ef_search", req.ef_search, retrieval.max_ef_search),
        nprobe=_bounded("nprobe", req.nprobe, retrieval.max_nprobe),
        allow_early_exit=req.allow_early_exit,
        # The server's default named, so that the cache key changes with the setting.
        retrieval=req.retrieval or retrieval.retrieval_mode,
        filter=req.filter,
        diversity=req.diversity,
    )


def deadline_s(header: str | None, s: ApiSettings) -> float:
    """The request's deadline: ``X-Request-Deadline-Ms`` (one positive integer) or the default,
    within the configured bounds. The one place a deadline is clamped."""
    ms = s.default_deadline_ms
    if header is not None:
        if not (header.isascii() and header.isdigit()) or int(header) < 1:
            raise _invalid("X-Request-Deadline-Ms must be a positive integer (ms)")
        ms = int(header)
    return min(max(ms, s.min_deadline_ms), s.max_deadline_ms) / 1000
