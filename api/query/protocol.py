"""Request and response bodies of the query endpoints (the request's model is the contract's:
a job's record keeps it whole, see :mod:`ragline.broker.contract.requests`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from ragline.broker.contract.messages import Done, Source, Timings, Usage
from ragline.broker.contract.requests import QueryRequest

__all__ = [
    "ErrorBody",
    "QueryRequest",
    "QueryResponse",
    "Source",
    "StreamDone",
    "Timings",
    "Usage",
    "json_body",
]


class QueryResponse(Done):
    """The JSON answer: every field of the request's `done` event, with its id and sources."""

    request_id: str
    sources: list[Source]


class StreamDone(Done):
    """The stream's ``done`` event as the API sends it: the worker's, with the request's id."""

    request_id: str


class ErrorBody(BaseModel):
    error: str
    message: str
    request_id: str | None = None


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that hands its raw body to the pipeline's validate
    step (one validation, one set of messages, for every endpoint): ``model``'s schema."""
    schema = body_schema(model)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with the models it uses written where they are used: a
    ``#/$defs/...`` reference inside an operation points at nothing in the OpenAPI document
    (Redoc stops on it, and a fuzzer cannot build the body)."""
    schema = model.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})

    def inline(node: Any, within: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [inline(v, within) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in within:
                raise ValueError(f"{model.__name__} nests {name} in itself: it cannot be inlined")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return inline({**defs[name], **rest}, (*within, name))
        return {k: inline(v, within) for k, v in node.items()}

    inlined: dict[str, Any] = inline(schema, ())
    return inlined
