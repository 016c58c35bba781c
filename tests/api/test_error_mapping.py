"""What a client is told about an exception nothing else answered."""

from __future__ import annotations

import json

import pytest
from ragline.api.errors import api_error, error_response


def test_input_nested_past_the_stack_is_the_clients_fault() -> None:
    with pytest.raises(RecursionError) as deep:
        json.loads("[" * 1_000_000 + "]" * 1_000_000)
    error = api_error(deep.value)
    assert (error.status, error.error) == (400, "too_deep") and "nested" in error.message
    assert error_response(deep.value, "r1").status_code == 400


def test_anything_else_unforeseen_stays_a_500() -> None:
    assert api_error(KeyError("x")).status == 500
