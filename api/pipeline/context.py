"""The request context the pipeline's steps read and fill, and the validated query it carries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Generic, Literal, TypeVar

from ragline.api.pipeline.admission import ADMIT, Decision
from ragline.api.query.protocol import QueryRequest
from ragline.broker.contract.messages import ChatTurn, Degradation, MetadataFilter, RetrievalMode, Sampling
from ragline.broker.limits.leases import Lease

R = TypeVar("R", bound=QueryRequest)
Mode = Literal["rag", "retrieval"]


@dataclass(frozen=True, slots=True)
class Query:
    """A request's query once validated: what its tasks are given and its cache key is made of.

    Its fields are :class:`~ragline.broker.contract.messages.RetrieveRequest`'s own, passed on
    whole, and every
    one but the query's text and index (both already in the key) goes into the cache key's
    digest: a field added here reaches the worker and the key with nothing more to write."""

    query: str
    top_k: int
    mode: Mode
    index: str
    ef_search: int | None
    nprobe: int | None
    allow_early_exit: bool
    retrieval: RetrievalMode
    filter: MetadataFilter | None
    diversity: bool
    history: tuple[ChatTurn, ...]
    sampling: Sampling


# What the cache key's digest is made of besides the normalised text, in the fields' order.
KEYED = tuple(f.name for f in fields(Query) if f.name not in ("query", "index"))


@dataclass(frozen=True, slots=True)
class CacheSlot:
    """Where a computed answer is stored: its key, the index version the key names, and whether
    this request holds the key's single-flight claim (released if it cannot store an answer)."""

    key: str
    version: str
    leading: bool


@dataclass(slots=True, eq=False)
class QueryContext(Generic[R]):
    """One request on its way through the pipeline; each step fills in what it learnt."""

    request_id: str
    request: R | None  # the body as validated (None only for a resumed stream)
    query: Query | None  # its query; mode "retrieval" once degraded (None only for a resume)
    deadline_s: float
    single_flight: bool = False  # identical concurrent requests share one computation
    principal: str = "anonymous"  # the caller's key id: whose caps the request counts against
    streamed: bool = False  # answered as server-sent events: it holds one of its key's streams
    job_id: str | None = None  # an async job: its tasks mirror their events into its record
    started: float = field(default_factory=time.perf_counter)
    decision: Decision = ADMIT
    index_version: str = ""
    cached: bytes | None = None  # a cached answer's JSON (stored without a request id)
    slot: CacheSlot | None = None
    source_id: str = ""  # the stream whose events answer this request (a follower's: its leader's)
    lease: Lease | None = None  # one of its key's requests or streams, held until it ends

    @property
    def asked(self) -> Query:
        if self.query is None:
            raise RuntimeError("a resumed stream has no query")
        return self.query

    @property
    def answered_as(self) -> str:
        """How the request was answered, for the latency metric: cached, rag, retrieval or job."""
        if self.cached is not None:
            return "cached"
        return "job" if self.job_id is not None else self.asked.mode

    @property
    def degradation(self) -> Degradation | None:
        """What a degraded answer says of it (in the JSON answer and the stream's ``done``)."""
        d = self.decision
        return Degradation(degraded_reason=d.reason, notice=d.message) if d.degraded else None
