"""The web page at ``/``: static files from ``api/static``, no build step, nothing from elsewhere."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.errors import ApiError

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "static"
# Only these are served (no path from the request reaches the file system). The door lets them
# through without a key (api/access.py's OPEN_PATHS): the page asks for the key itself.
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
PAGE_PATHS = frozenset({"/", *(f"/static/{name}" for name in ASSETS)})
# The page's own files only: no inline script, no other origin.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
    "Cache-Control": "no-cache",
}


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", f"no file {name!r}")
    return FileResponse(STATIC / name, media_type=media_type, headers=_HEADERS)
