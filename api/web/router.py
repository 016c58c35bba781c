"""The web page at ``/``: static files from ``api/web/static``, no build step, nothing from elsewhere."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from ragline.api.errors import ApiError

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).resolve().parent / "static"
# Only these are served (no path from the request reaches the file system). The door lets them
# through without a key (api/access.py's OPEN_PATHS): the page asks for the key itself.
ASSETS = {
    "app.js": "text/javascript",
    "markdown.js": "text/javascript",
    "style.css": "text/css",
    "docs.js": "text/javascript",
}
PAGE_PATHS = frozenset({"/", *(f"/static/{name}" for name in ASSETS)})
# The page's own files only: no inline script, no other origin, no frame around it (the key it
# keeps must not be typed into a page that another site lays over or under it).
POLICY = (
    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_HEADERS = {"Content-Security-Policy": POLICY, "Cache-Control": "no-cache"}


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", f"no file {name!r}")
    return FileResponse(STATIC / name, media_type=media_type, headers=_HEADERS)
