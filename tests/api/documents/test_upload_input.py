"""An upload's names, ids and metadata on the wire, against a real API process (keys off, no
worker): each shape that once answered 500 gets a 4xx naming the limit or the reason, or is
accepted and staged under a name the ingest worker reads."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.integration

# An index of its own: the jobs these tests leave queued touch no other test's index.
INDEX = "upload-input"
URL = f"/v1/indexes/{INDEX}/documents"


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_file_name_of_the_longest_id_is_staged(client: httpx.Client) -> None:
    name = "n" * 253 + ".md"  # 256 characters: the longest document id
    reply = client.post(URL, files={"files": (name, b"# Title\n\nSome text.")})
    assert reply.status_code == 202, reply.text


def test_a_json_document_of_the_longest_id_is_staged(client: httpx.Client) -> None:
    reply = client.post(URL, json={"documents": [{"id": "i" * 256, "text": "Some text."}]})
    assert reply.status_code == 202, reply.text


def test_an_id_past_the_longest_is_refused_with_the_limit(client: httpx.Client) -> None:
    reply = client.post(URL, files={"files": ("n" * 254 + ".md", b"text")})
    assert reply.status_code == 422 and "256" in reply.json()["message"], reply.text
    reply = client.post(URL, json={"documents": [{"id": "i" * 257, "text": "text"}]})
    assert reply.status_code == 422 and "256" in reply.json()["message"], reply.text


@pytest.mark.parametrize("name", [".md", ".rst.txt", ".TXT", "dir/.html"])
def test_a_file_name_with_no_stem_is_refused(client: httpx.Client, name: str) -> None:
    reply = client.post(URL, files={"files": (name, b"# Title\n\nSome text.")})
    assert reply.status_code == 422, reply.text
    assert "no name before" in reply.json()["message"]


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_metadata_is_refused(client: httpx.Client, depth: int) -> None:
    nested_object = '{"a": ' * depth + '"x"' + "}" * depth
    for metadata in (_deep(depth), nested_object):
        reply = client.post(URL, files={"files": ("a.md", b"text")}, data={"metadata": metadata})
        # Too deep to be metadata (422), or longer than any metadata within the limits (413).
        assert reply.status_code in (413, 422), reply.text
        assert "metadata" in reply.json()["message"]


def test_deeply_nested_json_bodies_are_refused(client: httpx.Client) -> None:
    body = '{"documents": ' + _deep(100_000) + "}"
    headers = {"Content-Type": "application/json"}
    for path in (URL, "/v1/query", "/v1/jobs", "/v1/chat/completions"):
        reply = client.post(path, content=body, headers=headers)
        assert reply.status_code in (400, 413, 422), (path, reply.text)
    reply = client.post(URL, content=json.dumps({"documents": []}), headers=headers)
    assert reply.status_code == 422
