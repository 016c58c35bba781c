"""What the MCP tools take and give, and what they need of whoever answers them (a backend).

Two backends answer the same tools: over HTTP on the API (:mod:`ragline.api.mcp.service`, the
query pipeline of the request that carried the call) and over stdio (``ragline mcp``,
:mod:`ragline.mcp_stdio`, the Python client against an API). Both hand back the API's answer as
they have it (the server's models or the client's mirrors, field for field the same), so the
results are built here once, from the fields alone. Nothing here imports the server's parts but
its base exception: the stdio process loads this and the client only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from ragline.broker.errors import RaglineError


class PrefixFilter(BaseModel):
    """A filter value matching every value that starts with ``prefix``."""

    model_config = ConfigDict(extra="forbid")

    prefix: str


# A metadata filter as the API takes it: key -> a value, a list of values, or {"prefix": …}.
Filter = dict[str, str | list[str] | PrefixFilter]
Retrieval = Literal["dense", "lexical", "hybrid"]


class Refused(RaglineError):
    """The API refused or failed the call: its HTTP-like status, error code and message, and when
    to come back (429, 503). A tool answers it as an error result an agent can read."""

    def __init__(self, status: int, error: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        again = f" (retry in {self.retry_after_s:g} s)" if self.retry_after_s else ""
        return f"{self.status} {self.error}: {self.message}{again}"


# -- what a backend hands back: the API's answer, read by its fields ----------------------------


class SourceFields(Protocol):
    @property
    def chunk_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def anchor(self) -> str: ...


class CitationFields(Protocol):
    @property
    def marker(self) -> int: ...


class AnswerFields(Protocol):
    """``POST /v1/query``'s answer (the server's ``QueryResponse`` or the client's)."""

    @property
    def request_id(self) -> str: ...
    @property
    def answer(self) -> str | None: ...
    @property
    def sources(self) -> Sequence[SourceFields]: ...
    @property
    def citations(self) -> Sequence[CitationFields]: ...
    @property
    def degraded(self) -> bool: ...
    @property
    def notice(self) -> str | None: ...
    @property
    def cached(self) -> bool | Literal["semantic"]: ...
    @property
    def early_exit(self) -> bool: ...
    @property
    def finish_reason(self) -> Literal["stop", "length"] | None: ...
    @property
    def partial(self) -> bool: ...


class Progress(Protocol):
    """Told what an answer is doing while it is computed (the ``ask`` tool's notifications)."""

    async def retrieved(self, sources: int) -> None: ...
    async def generated(self, text: str) -> None: ...
    async def restarted(self) -> None: ...


class Backend(Protocol):
    """What the tools and resources need; each raises :class:`Refused` for what the API refuses."""

    async def query(self, request: dict[str, Any], progress: Progress | None) -> AnswerFields:
        """The answer to ``request`` (``POST /v1/query``'s body), reporting to ``progress``."""
        ...

    async def indexes(self) -> dict[str, Any]:
        """``GET /v1/indexes``'s body."""
        ...

    async def index(self, name: str) -> dict[str, Any]:
        """``GET /v1/indexes/{name}``'s body."""
        ...


# -- what the tools give ------------------------------------------------------------------------


class Passage(BaseModel):
    n: int = Field(description="Its number: an answer cites it as [n].")
    title: str = Field(
        description="The title path of its section: 'Simple statements › The global statement'."
    )
    source: str = Field(description="Its file, under what was ingested.")
    anchor: str = Field(description="The section's anchor in its file ('' when it has none).")
    score: float = Field(description="What ranked it: cosine (dense), BM25 (lexical) or fused rank (hybrid).")
    text: str
    chunk_id: str


class SearchResult(BaseModel):
    request_id: str
    passages: list[Passage] = Field(description="Best first.")
    cached: bool | Literal["semantic"] = Field(
        description='Served from the result cache ("semantic": a close earlier question\'s answer).'
    )
    partial: bool = Field(
        description="Some shards of a sharded index did not answer: passages from the others."
    )


class AskResult(BaseModel):
    request_id: str
    answer: str | None = Field(
        description="The answer, citing its sources as [n]; null when generation was too busy (degraded)."
    )
    cited: list[int] = Field(description="The [n] the answer cites, in order of first citation.")
    sources: list[Passage] = Field(
        description="The sources the answer was grounded in, numbered as it cites them."
    )
    degraded: bool = Field(description="Generation was too busy for the deadline: sources only, no answer.")
    notice: str | None = Field(description="Why there is no answer, when degraded.")
    cached: bool | Literal["semantic"]
    early_exit: bool = Field(description="Answered with the best source's text, without generating.")
    finish_reason: Literal["stop", "length"] | None
    partial: bool


def passages(sources: Sequence[SourceFields]) -> list[Passage]:
    """The sources numbered from 1 in the order the API gives them: the order the prompt
    numbered them in, so [n] in an answer is passage n."""
    return [
        Passage(
            n=n,
            title=s.title,
            source=s.source,
            anchor=s.anchor,
            score=s.score,
            text=s.text,
            chunk_id=s.chunk_id,
        )
        for n, s in enumerate(sources, start=1)
    ]


def search_result(answer: AnswerFields) -> SearchResult:
    return SearchResult(
        request_id=answer.request_id,
        passages=passages(answer.sources),
        cached=answer.cached,
        partial=answer.partial,
    )


def ask_result(answer: AnswerFields) -> AskResult:
    return AskResult(
        request_id=answer.request_id,
        answer=answer.answer,
        cited=[c.marker for c in answer.citations],
        sources=passages(answer.sources),
        degraded=answer.degraded,
        notice=answer.notice,
        cached=answer.cached,
        early_exit=answer.early_exit,
        finish_reason=answer.finish_reason,
        partial=answer.partial,
    )


# -- as text, for the agent that reads the tool's content ---------------------------------------


def _where(p: Passage) -> str:
    return f"{p.source}#{p.anchor}" if p.anchor else p.source


def search_text(result: SearchResult) -> str:
    if not result.passages:
        return "No passage matched."
    return "\n\n".join(
        f"[{p.n}] {p.title} ({_where(p)}, score {p.score:.3f})\n{p.text}" for p in result.passages
    )


def ask_text(result: AskResult) -> str:
    head = result.answer
    if head is None:
        head = result.notice or "No answer was generated; these are the retrieved sources."
    listed = "\n".join(f"[{p.n}] {p.title} ({_where(p)})" for p in result.sources)
    return f"{head}\n\nSources:\n{listed}" if listed else head
