"""The validate step's checks (no I/O): the body against its model, the query against the server's
bounds, the deadline; each refusal a 4xx naming what is wrong."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from ragline.api.errors import ApiError, invalid
from ragline.api.pipeline.context import Query
from ragline.api.query.protocol import QueryRequest
from ragline.broker.config.settings import ApiSettings, GenerationSettings, RetrievalSettings
from ragline.broker.contract.messages import Sampling
from ragline.broker.state import indexes, shards

# Any request body: a query endpoint's, or one of its own shape (the chat endpoint's).
M = TypeVar("M", bound=BaseModel)

# A stop sequence longer than this cannot be meant: the answer itself is a few hundred tokens.
MAX_STOP_CHARS = 256


JSON_TYPE = "application/json"


def json_content(content_type: str | None) -> bool:
    """Whether a body of this type is read as JSON: ``*/json`` or ``*/*+json``. A body without a
    type is not: a page elsewhere may send one (as ``text/plain``, say) with no preflight, and a
    body read as JSON whatever its type would let it post a job."""
    if content_type is None:
        return False
    subtype = content_type.split(";", 1)[0].strip().lower().partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


def parse_body(body: bytes, model: type[M], content_type: str | None) -> M:
    """The body as ``model``: 415 unless it says it is JSON, 400 when it is not, 422 naming each
    field that is wrong."""
    if not json_content(content_type):
        got = "none" if content_type is None else repr(content_type[:100])
        raise ApiError(
            415,
            "unsupported_media_type",
            f"the body must be JSON, sent with Content-Type: application/json (got {got})",
        )
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise invalid(list(exc.errors())) from None


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(422, "invalid_request", message, param=param)


def _bounded(name: str, value: int | None, upper: int) -> int | None:
    if value is not None and not 1 <= value <= upper:
        raise _invalid(f"{name} must be between 1 and {upper}, got {value}", name)
    return value


def query_of(
    req: QueryRequest, s: ApiSettings, retrieval: RetrievalSettings, generation: GenerationSettings
) -> Query:
    """The request's query with the server's defaults filled in, within the server's bounds."""
    text = req.query.strip()
    if not text:
        raise _invalid("query must not be empty", "query")
    size = len(text.encode())
    if size > s.max_query_bytes:
        raise _invalid(f"query is {size} bytes; the limit is {s.max_query_bytes}", "query")
    top_k = s.default_top_k if req.top_k is None else req.top_k
    if not 1 <= top_k <= s.max_top_k:
        raise _invalid(f"top_k must be between 1 and {s.max_top_k}, got {top_k}", "top_k")
    index = req.index or retrieval.default_index
    if not indexes.valid_index_name(index):
        raise _invalid(f"index must be {indexes.INDEX_NAME_RULE}", "index")
    if (shard := shards.split_shard(index)) is not None:
        # A shard answers for part of its index only (and a worker that takes batches may hold
        # no shard at all): searched on its own, it would be loaded where it was never meant to be.
        parent = shard[0]
        message = f"{index!r} is a shard of index {parent!r}, not an index: query {parent!r}"
        raise ApiError(404, "unknown_index", message)
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
        history=tuple(req.history[-s.max_history_turns :]) if s.max_history_turns > 0 else (),
        sampling=sampling_of(req, s, generation),
    )


def sampling_of(req: QueryRequest, s: ApiSettings, generation: GenerationSettings) -> Sampling:
    """The request's sampling with the server's defaults named (they are in the cache key) and
    its max_tokens capped at the server's."""
    if req.max_tokens is not None and req.max_tokens < 1:
        raise _invalid(f"max_tokens must be at least 1, got {req.max_tokens}", "max_tokens")
    max_tokens = min(req.max_tokens or generation.max_new_tokens, generation.max_new_tokens)
    temperature = generation.temperature if req.temperature is None else float(req.temperature)
    if not 0.0 <= temperature <= s.max_temperature:
        raise _invalid(
            f"temperature must be between 0 and {s.max_temperature}, got {temperature}", "temperature"
        )
    stop = tuple(dict.fromkeys(req.stop or ()))
    if len(stop) > s.max_stop_sequences:
        raise _invalid(f"stop has {len(stop)} sequences; the limit is {s.max_stop_sequences}", "stop")
    if any(not 1 <= len(seq) <= MAX_STOP_CHARS for seq in stop):
        raise _invalid(f"each stop sequence must be 1 to {MAX_STOP_CHARS} characters", "stop")
    return Sampling(max_tokens=max_tokens, temperature=temperature, stop=stop)


def deadline_s(header: str | None, s: ApiSettings) -> float:
    """The request's deadline: ``X-Request-Deadline-Ms`` (one positive integer) or the default,
    within the configured bounds. The one place a deadline is clamped."""
    ms = s.default_deadline_ms
    if header is not None:
        if not (header.isascii() and header.isdigit()) or int(header) < 1:
            raise _invalid("X-Request-Deadline-Ms must be a positive integer (ms)")
        ms = int(header)
    return min(max(ms, s.min_deadline_ms), s.max_deadline_ms) / 1000
