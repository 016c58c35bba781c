"""Where an upload's documents are staged: a name the file system takes and the ingest worker reads
as the type the API accepted, whatever the document's name or id."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragline.api.documents.service import Incoming, _stage, _staged_name, check_file_type
from ragline.api.errors import ApiError
from ragline.broker.contract.messages import DOCUMENT_SUFFIXES, UploadManifest, document_type

KINDS = st.sampled_from(DOCUMENT_SUFFIXES)
NAMES = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")), max_size=256)


@settings(max_examples=300, deadline=None)
@given(stem=NAMES, kind=KINDS)
def test_a_staged_name_fits_and_keeps_its_type(stem: str, kind: str) -> None:
    name = _staged_name(stem, kind)
    assert len(name.encode()) <= 255 and "/" not in name and not name.startswith(".")
    assert document_type(name) == kind


def test_a_json_document_named_like_another_type_is_read_as_its_format() -> None:
    assert document_type(_staged_name("notes.rst", ".txt")) == ".txt"
    assert _staged_name("notes.v2", ".md") == "notes.v2.md"


def test_the_longest_ids_stage_on_disk(tmp_path: Path) -> None:
    ids = ["n" * 253 + ".md", "é" * 256, "." * 256]
    found = [
        Incoming(doc_id, f"{i}/{_staged_name(doc_id, '.txt')}", {}, lambda p: p.write_text("text"))
        for i, doc_id in enumerate(ids)
    ]
    _stage(tmp_path, "job", found)
    manifest = UploadManifest.decode((tmp_path / "job" / "manifest.json").read_text())
    assert [d.id for d in manifest.documents] == ids
    assert all((tmp_path / "job" / d.file).is_file() for d in manifest.documents)


@pytest.mark.parametrize(
    ("name", "status", "needle"),
    [(".md", 422, "no name before"), (".rst.txt", 422, "notes.rst.txt"), ("a.pdf", 415, ".md")],
)
def test_a_file_type_is_checked_at_the_api(name: str, status: int, needle: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_file_type(name)
    assert refused.value.status == status and needle in refused.value.message
