"""A document's metadata within its bounds: keys, a value's length, depth and bytes, each refusal
naming its setting (422, or 413 for bytes)."""

from __future__ import annotations

import json

import pytest
from ragline.broker.config.settings import RetrievalSettings
from ragline.broker.limits.metadata import (
    MetadataLimits,
    MetadataRefused,
    check_metadata,
    parse_metadata_json,
)

LIMITS = MetadataLimits(max_keys=4, max_value_chars=10, max_bytes=40)


def _refused(meta: object, limits: MetadataLimits = LIMITS) -> MetadataRefused:
    with pytest.raises(MetadataRefused) as refused:
        if isinstance(meta, str):
            parse_metadata_json(meta, limits, what="metadata")
        else:
            check_metadata(meta, limits, what="metadata")  # type: ignore[arg-type]
    return refused.value


def test_metadata_within_every_bound_passes_as_a_plain_dict() -> None:
    meta = {"a": "x" * 10, "b": "y", "c": "", "d": "z"}  # 4 keys, 10 characters, 16 bytes
    assert check_metadata(meta, LIMITS, what="metadata") == meta
    assert parse_metadata_json(json.dumps(meta), LIMITS, what="metadata") == meta
    assert check_metadata({}, LIMITS, what="metadata") == {}


def test_past_the_key_count_is_422_naming_the_setting() -> None:
    refused = _refused({str(i): "v" for i in range(5)})
    assert refused.status == 422
    assert "5 keys" in refused.message and "the limit is 4 (RAGLINE_METADATA_MAX_KEYS)" in refused.message


def test_a_value_past_its_length_is_422_naming_the_key_and_the_setting() -> None:
    refused = _refused({"team": "x" * 11})
    assert refused.status == 422
    assert "'team'" in refused.message and "RAGLINE_METADATA_MAX_VALUE_CHARS" in refused.message


def test_past_the_bytes_is_413_counting_keys_and_utf8() -> None:
    # 4 values of 10 characters: within count and length, 44 bytes with the keys.
    refused = _refused({k: "v" * 10 for k in "abcd"})
    assert refused.status == 413 and "44 bytes" in refused.message
    assert "the limit is 40 (RAGLINE_METADATA_MAX_BYTES)" in refused.message
    # é is two bytes: 1 + 2·10 = 21 per key, 42 in all.
    assert _refused({"a": "é" * 10, "b": "é" * 10}).status == 413


@pytest.mark.parametrize("value", [{"x": "y"}, ["y"], 3, None, True])
def test_anything_but_a_string_is_depth_past_one(value: object) -> None:
    refused = _refused({"team": value})
    assert refused.status == 422 and "depth 1" in refused.message and "'team'" in refused.message


def test_json_nested_deeper_than_the_parser_recurses_is_422_not_a_crash() -> None:
    deep = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"
    limits = MetadataLimits(max_keys=4, max_value_chars=10, max_bytes=4096)
    refused = _refused(deep, limits)
    assert refused.status == 422 and "depth 1" in refused.message
    nested = _refused('{"a": {"b": "c"}}')
    assert nested.status == 422 and "depth 1" in nested.message


@pytest.mark.parametrize("raw", ["[]", '"text"', "{not json", "3"])
def test_json_that_is_not_an_object_is_422(raw: str) -> None:
    refused = _refused(raw)
    assert refused.status == 422 and "JSON object of strings" in refused.message


def test_json_text_far_past_the_budget_is_413_before_it_is_parsed() -> None:
    refused = _refused(json.dumps({"a": "x" * 10_000}))
    assert refused.status == 413 and "RAGLINE_METADATA_MAX_BYTES" in refused.message


def test_the_limits_come_from_the_settings() -> None:
    settings = RetrievalSettings(metadata_max_keys=2, metadata_max_value_chars=3, metadata_max_bytes=5)
    assert MetadataLimits.of(settings) == MetadataLimits(2, 3, 5)
    with pytest.raises(ValueError, match="at least 1"):
        RetrievalSettings(metadata_max_keys=0)
