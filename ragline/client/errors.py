"""The client's exceptions: one per error status the API answers, and its own."""

from __future__ import annotations

import httpx

from ragline.client.protocol import JobView

# -- errors -------------------------------------------------------------------------------------


class RaglineError(Exception):
    """Anything this client raises on purpose."""


class APIError(RaglineError):
    """The server answered with an error status: ``{error, message, request_id}``."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after  # seconds, from the Retry-After header


class BadRequest(APIError):
    """400: malformed JSON, an empty or too long query, a value out of range."""


class InvalidRequest(BadRequest):
    """422: the body or a parameter does not have the expected shape."""


class Unauthorized(APIError):
    """401: no API key, or one that is unknown or revoked."""


class Forbidden(APIError):
    """403: the key may not do this (writing to an index needs scope admin or write:INDEX)."""


class UnsupportedMediaType(APIError):
    """415: a file of a type ragline does not read, or a body neither multipart nor JSON."""


class NotFound(APIError):
    """404: an unknown index, job or stream."""


class Conflict(APIError):
    """409: e.g. cancelling a job that has finished."""


class PayloadTooLarge(APIError):
    """413: the body is over the server's limit."""


class RateLimited(APIError):
    """429: over the key's or the server's rate limit; ``retry_after`` says when to come back."""


class Unavailable(APIError):
    """503: the server cannot take the request now (load, or a part down); see ``retry_after``."""


_ERRORS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


class StreamInterrupted(RaglineError):
    """A stream's connection dropped and every reconnection failed. ``resume(request_id,
    last_event_id)`` later picks it up where it stopped, while the server keeps its events."""

    def __init__(self, message: str, *, request_id: str | None, last_event_id: str | None) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.last_event_id = last_event_id


class JobTimeout(RaglineError, TimeoutError):
    """``wait_job`` gave up before the job finished; ``job`` is its last state seen."""

    def __init__(self, job: JobView, timeout_s: float) -> None:
        super().__init__(f"job {job.job_id} still {job.status} after {timeout_s:g} s")
        self.job = job


class JobFailed(RaglineError):
    """A job this client waited for failed or was cancelled; ``job`` says why (``job.error``)."""

    def __init__(self, job: JobView) -> None:
        error = job.error.message if job.error else job.status
        super().__init__(f"job {job.job_id} {job.status}: {error}")
        self.job = job


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ragline sends seconds


def api_error(response: httpx.Response) -> APIError:
    """The exception for an error response (its body read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"message": response.text[:500] or response.reason_phrase}
    return _ERRORS.get(response.status_code, APIError)(
        response.status_code,
        str(body.get("error") or "http_error"),
        str(body.get("message") or response.reason_phrase),
        request_id=body.get("request_id") or response.headers.get("x-request-id"),
        retry_after=_retry_after(response.headers.get("retry-after")),
    )
