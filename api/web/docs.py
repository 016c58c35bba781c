"""The OpenAPI pages, ``/docs`` (Swagger UI) and ``/redoc``, on scripts this API serves itself.

FastAPI's own pages load Swagger UI and Redoc from a CDN: script from another origin, on the
origin where the page at ``/`` keeps its key. These load the copies the ``fastapi-offline``
package ships (a server dependency), under the same kind of policy as the page: script from this
origin only, never inline; no frame. Its styles are let inline: both renderers set styles at run
time, and a style reads no key.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from ragline.api.errors import ApiError
from ragline.api.web.router import STATIC

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

# The packaged files served under /docs/assets/ (nothing else of that folder is reachable).
VENDORED = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
}
DOCS_PATHS = frozenset({"/docs", "/redoc", *(f"/docs/assets/{name}" for name in VENDORED)})
POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_HEADERS = {"Content-Security-Policy": POLICY, "Cache-Control": "no-cache"}


@functools.cache
def vendored_folder() -> Path | None:
    """The folder of fastapi-offline's packaged Swagger UI and Redoc, found without importing it."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        log.warning("fastapi-offline is not installed: /docs and /redoc have no scripts to load")
        return None
    return Path(spec.origin).parent / "static"


@router.get("/docs")
async def swagger_ui() -> FileResponse:
    return FileResponse(STATIC / "docs.html", media_type="text/html", headers=_HEADERS)


@router.get("/redoc")
async def redoc() -> FileResponse:
    return FileResponse(STATIC / "redoc.html", media_type="text/html", headers=_HEADERS)


@router.get("/docs/assets/{name}")
async def vendored(name: str) -> FileResponse:
    media_type = VENDORED.get(name)
    folder = vendored_folder()
    if media_type is None:
        raise ApiError(404, "not_found", f"no file {name!r}")
    if folder is None or not (folder / name).is_file():
        raise ApiError(
            404, "not_found", f"{name!r} is not installed: the server's dependencies include fastapi-offline"
        )
    return FileResponse(folder / name, media_type=media_type, headers=_HEADERS)
