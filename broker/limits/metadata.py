"""Bounds on a document's metadata: upload metadata, front matter, ``ragline ingest --meta``.

A document's metadata is stored once per document, loaded by every retrieval worker that holds
its index, matched by filters and shipped with each hit of a shard search, so one upload must not
be able to make it large. It is a flat object of strings (depth 1), with at most
``metadata_max_keys`` keys, values of at most ``metadata_max_value_chars`` characters and at most
``metadata_max_bytes`` bytes of keys and values together (UTF-8). The API checks an upload's
metadata before staging it; the ingest checks each document's again once its front matter is
read (the CLI's and the JSON documents' paths included), since the two are merged there.

Past the byte budget is 413 (too large), any other bound 422; each message names its setting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ragline.broker.config.settings import ENV_PREFIX, RetrievalSettings
from ragline.broker.errors import RaglineError


@dataclass(frozen=True, slots=True)
class MetadataLimits:
    max_keys: int
    max_value_chars: int
    max_bytes: int

    @classmethod
    def of(cls, settings: RetrievalSettings) -> MetadataLimits:
        return cls(settings.metadata_max_keys, settings.metadata_max_value_chars, settings.metadata_max_bytes)


class MetadataRefused(RaglineError, ValueError):
    """Metadata past one of its bounds; ``status`` is the HTTP status that says so (413 or 422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _setting(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def check_metadata(meta: Mapping[str, object], limits: MetadataLimits, *, what: str) -> dict[str, str]:
    """``meta`` as a plain dict of strings when it keeps within ``limits``; else MetadataRefused,
    whose message starts with ``what`` ("metadata of document 'faq-7'") and names the setting."""
    flat: dict[str, str] = {}
    for key, value in meta.items():
        if not isinstance(value, str):
            raise MetadataRefused(
                422,
                f"{what}: {key[:40]!r} holds {_kind(value)}; metadata is flat, a JSON object of strings "
                "(depth 1)",
            )
        flat[key] = value
    if len(flat) > limits.max_keys:
        raise MetadataRefused(
            422,
            f"{what} has {len(flat)} keys; the limit is {limits.max_keys} ({_setting('metadata_max_keys')})",
        )
    for key, value in flat.items():
        if len(value) > limits.max_value_chars:
            raise MetadataRefused(
                422,
                f"{what}: the value of {key[:40]!r} is {len(value)} characters; the limit is "
                f"{limits.max_value_chars} ({_setting('metadata_max_value_chars')})",
            )
    # surrogatepass: JSON may carry a lone surrogate, which must be counted, not crash the count.
    size = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in flat.items()
    )
    if size > limits.max_bytes:
        raise MetadataRefused(
            413,
            f"{what} is {size} bytes (keys and values); the limit is {limits.max_bytes} "
            f"({_setting('metadata_max_bytes')})",
        )
    return flat


def parse_metadata_json(raw: str, limits: MetadataLimits, *, what: str) -> dict[str, str]:
    """Metadata sent as JSON text (a multipart form's ``metadata`` field), checked as
    :func:`check_metadata` does. Text far past what any metadata within the limits takes (escapes
    and spacing allowed for) is refused before it is parsed, and so is nesting deeper than the
    parser's recursion: a flat object needs one level."""
    most = 8 * limits.max_bytes + 16 * limits.max_keys
    if len(raw) > most:
        raise MetadataRefused(
            413,
            f"{what} is {len(raw)} characters of JSON, more than any metadata within "
            f"{limits.max_bytes} bytes of keys and values takes ({_setting('metadata_max_bytes')})",
        )
    try:
        value = json.loads(raw)
    except RecursionError:
        raise MetadataRefused(
            422, f"{what} nests too deep; metadata is flat, a JSON object of strings (depth 1)"
        ) from None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise MetadataRefused(422, f'{what} must be a JSON object of strings, e.g. {{"team": "docs"}}')
    return check_metadata(value, limits, what=what)
