"""Bodies of the document endpoints: an upload as JSON, a page of an index's documents."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

# How a JSON document's text is read: headings (md, rst, html) make its sections, as in files.
DocumentFormat = Literal["txt", "md", "rst", "html"]


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: StrictStr = Field(
        description="The document's id in its index (1..256 printable characters): an upload with "
        "an id the index has replaces that document; DELETE .../documents/{id} removes it."
    )
    text: StrictStr = Field(description="The document's text.")
    metadata: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Metadata on each of its chunks, for query filters."
    )
    format: DocumentFormat = Field(
        default="txt", description="How the text is read: `md`, `rst` and `html` headings make sections."
    )


class DocumentsUpload(BaseModel):
    """``POST /v1/indexes/{name}/documents`` as ``application/json``."""

    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(
        description="At least one, at most RAGLINE_UPLOAD_MAX_DOCUMENTS; ids unique in the upload."
    )
    webhook_url: StrictStr | None = Field(
        default=None, description="Receives the finished job, signed (docs/webhooks.md)."
    )


class DocumentSummary(BaseModel):
    id: str
    title: str = Field(description="Its first section's title.")
    path: str = Field(description="The file it came from (as uploaded or ingested), else its id.")
    chunks: int


class DocumentList(BaseModel):
    index: str
    version: str = Field(description="The version these documents are in: the one queries use.")
    total: int = Field(description="Documents in this version.")
    documents: list[DocumentSummary] = Field(description="In id order.")
    next_after: str | None = Field(
        default=None, description="Pass as `after` for the next page; null on the last page."
    )
