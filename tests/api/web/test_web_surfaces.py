"""What a browser elsewhere could do with this API, refused on real API processes: pages that may
not be framed or sniffed and load no script from elsewhere, JSON bodies only with their type,
Host names the API answers to, writes from its own pages only, and readiness details for admins."""

from __future__ import annotations

import re

import httpx
import pytest
import redis
from ragline.api.web.docs import VENDORED
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from tests.helpers import Api, api_key

pytestmark = pytest.mark.integration

PAGES = ("/", "/docs", "/redoc")


@pytest.mark.parametrize("path", PAGES)
def test_pages_may_not_be_framed_and_load_only_their_own_files(client: httpx.Client, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
    assert "script-src" not in policy and "unsafe-eval" not in policy  # scripts: this origin's files
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"
    loaded = re.findall(r'(?:src|href|spec-url)="([^"]+)"', page.text)
    assert loaded and all(u.startswith("/") or u == "data:," for u in loaded), loaded
    for url in loaded:
        if url.startswith("/"):
            assert client.get(url).status_code == 200, url
    assert "<script>" not in page.text  # nothing inline: the policy would not run it


def test_the_docs_scripts_are_packaged(client: httpx.Client) -> None:
    for name in VENDORED:
        reply = client.get(f"/docs/assets/{name}")
        assert reply.status_code == 200 and len(reply.content) > 10_000, name
    assert client.get("/docs/assets/../router.py").status_code == 404
    assert client.get("/docs/assets/favicon.png").status_code == 404  # only what is listed


def test_json_answers_are_not_documents_either(client: httpx.Client) -> None:
    reply = client.get("/healthz")
    assert reply.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
    assert reply.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path", ["/v1/query", "/v1/query/stream", "/v1/jobs", "/v1/chat/completions", "/v1/indexes/x/documents"]
)
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_must_say_it_is_json(client: httpx.Client, path: str, content_type: str | None) -> None:
    body = b'{"query": "When does the cafe open?", "model": "test", "messages": []}'
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = client.post(path, content=body, headers=headers)
    assert reply.status_code == 415, reply.text
    payload = reply.json()
    message = payload["error"]["message"] if path.startswith("/v1/chat/") else payload["message"]
    assert "Content-Type" in message or "multipart/form-data" in message


@pytest.mark.parametrize("path", ["/", "/healthz", "/v1/indexes"])
def test_a_host_the_api_does_not_answer_to_is_refused(client: httpx.Client, path: str) -> None:
    reply = client.get(path, headers={"Host": "rebound.attacker.example:8000"})
    assert reply.status_code == 421 and "RAGLINE_ALLOWED_HOSTS" in reply.json()["message"]
    port = client.base_url.port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert client.get("/healthz", headers={"Host": host}).status_code == 200


def test_a_form_from_another_origin_uploads_nothing(client: httpx.Client) -> None:
    files = {"files": ("a.md", b"# Planted\n\nText from a page elsewhere.")}
    reply = client.post(
        "/v1/indexes/upload-input/documents", files=files, headers={"Origin": "https://attacker.example"}
    )
    assert reply.status_code == 403 and "another origin" in reply.json()["message"]
    own = f"http://127.0.0.1:{client.base_url.port}"
    reply = client.post("/v1/indexes/upload-input/documents", files=files, headers={"Origin": own})
    assert reply.status_code == 202, reply.text


def test_readiness_details_need_an_admin_key(auth_apis: list[Api], settings: Settings) -> None:
    base = auth_apis[0].base
    reader, _ = api_key(settings)
    admin, _ = apikeys.create(
        redis.Redis.from_url(settings.redis.redis_url),
        Keys(settings.redis.key_prefix),
        "ops",
        scopes=["admin"],
    )
    for headers in ({}, {"Authorization": f"Bearer {reader}"}, {"Authorization": "Bearer rl_guess"}):
        reply = httpx.get(base + "/readyz", headers=headers, timeout=10)
        assert reply.status_code in (200, 503)
        assert set(reply.json()) == {"ready"}, reply.text
    detailed = httpx.get(base + "/readyz", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert detailed.status_code == reply.status_code
    assert {"ready", "redis", "workers"} <= set(detailed.json()), detailed.text
