"""What the door answers on /mcp (api/errors.py): a JSON-RPC error an MCP client can read, with the
status and headers the API would send anywhere else."""

from __future__ import annotations

import json

import pytest
from mcp_types import JSONRPCError
from ragline.api.errors import ApiError, error_response


@pytest.mark.unit
def test_a_refusal_on_mcp_is_a_json_rpc_error_with_its_status_and_headers() -> None:
    limited = ApiError(429, "rate_limited", "over this API key's rate limit", headers={"Retry-After": "2"})
    reply = error_response(limited, "r1", path="/mcp")
    assert reply.status_code == 429
    assert reply.headers["Retry-After"] == "2" and reply.headers["X-Request-Id"] == "r1"
    body = json.loads(reply.body)
    parsed = JSONRPCError.model_validate(body)  # as the SDK's client reads a non-2xx body
    assert parsed.id is None
    assert parsed.error.message == "429 rate_limited: over this API key's rate limit"
    assert body["error"]["data"] == {
        "status": 429,
        "error": "rate_limited",
        "message": "over this API key's rate limit",
        "request_id": "r1",
    }
    # Elsewhere the API's own shape is unchanged.
    assert json.loads(error_response(limited, "r1", path="/v1/query").body)["error"] == "rate_limited"
