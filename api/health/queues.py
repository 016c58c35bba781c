"""``GET /v1/health/queues``: each queue's depth, live workers, service rate and predicted wait, as
this API process's admission sees them (admin scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from ragline.api.errors import ApiError
from ragline.api.health.protocol import QueuesHealth
from ragline.api.query.protocol import ErrorBody
from ragline.broker.state import apikeys

router = APIRouter(prefix="/v1/health", tags=["health"])


@router.get(
    "/queues",
    response_model=QueuesHealth,
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
)
async def queues(request: Request) -> QueuesHealth:
    """The numbers admission decides on: read from this process's copy of the shared snapshot (no
    Redis call), with the requests it admitted since, so it answers even while Redis does not
    (then ``fresh`` is false: admission admits everything until a snapshot comes)."""
    if apikeys.ADMIN not in getattr(request.state, "scopes", ()):
        raise ApiError(
            403,
            "forbidden",
            "queue health needs an API key with scope admin (ragline keys create --scope admin)",
        )
    view = request.app.state.admission.view()
    return QueuesHealth.of(view, default_deadline_s=request.app.state.settings.api.default_deadline_ms / 1000)
