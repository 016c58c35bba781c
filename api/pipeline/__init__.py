"""The query pipeline: every query endpoint runs the same named steps over one request context.

    validate → result cache → admission → hold → enqueue or coalesce → relay events → (render)

``POST /v1/query`` renders the events as one JSON answer, ``POST /v1/query/stream`` as server-sent
events, ``POST /v1/jobs`` as a job record (the tasks write it, so a job stops after enqueueing);
see :mod:`ragline.api.query.render`. Each step is a method that reads and fills the :class:`QueryContext`:

- **validate**: the body against the endpoint's model, then the bounds (query size, ``top_k``,
  index name, search effort), and the deadline: ``X-Request-Deadline-Ms`` or the default, clamped
  here and nowhere else.
- **result cache**: one Lua call answers whether the index exists (else 404), its version, and
  the cached answer; for an admitted JSON request it also claims the computation (single flight:
  identical concurrent requests follow the first one's events instead of computing again).
  Jobs skip it: a job runs its tasks, whose events drive its record; they look up the index only.
- **admission**: the decision (admit, degrade to retrieval-only, refuse with 503) is taken before
  the cache step, since it is free (this process's backpressure snapshot) and the cache step
  claims a computation only for a request that will be computed; it is applied after it, since
  a hit touches no queue and is served whatever the load. A degraded request looks its
  retrieval answer up in turn.
- **hold**: a request that will wait for events takes one of its key's leases (one of its
  streams for SSE, resumes included, else one of its requests; :mod:`ragline.broker.limits.leases`), 429
  ``key_cap`` past the key's cap; it is let go when the events end or the response does. A
  cache hit holds nothing; a job is capped where its record is created instead.
- **enqueue or coalesce**: a follower of a single flight enqueues nothing; everything else goes
  to the coalescer (:mod:`ragline.api.pipeline.coalescer`), which sends concurrent queries as one
  retrieval task.
- **relay events**: the request's event stream (a follower's: its leader's), each ``done``
  completed with what only the API knows (its total time, admission's predicted wait, why it was
  degraded); the answer is stored in the result cache when it was computed on the version its
  key names, and a claim it cannot fill is released.

An endpoint whose body has a shape of its own (the OpenAI-compatible chat endpoint) builds the
query request from it and enters at :meth:`Pipeline.context`, the validate step past the body.

Errors are raised as they are found; :mod:`ragline.api.errors` is the one place that turns them into
responses. The pipeline knows no HTTP framework: its inputs are bytes and header values, so the
fast path (:mod:`ragline.api.pipeline.fast_path`) and the framework's routes call the same steps.

Modules: :mod:`.context` (the context and the validated query), :mod:`.validate` (the validate
step's checks and the deadline), :mod:`.steps` (the steps), :mod:`.connect` (the real parts the
steps are given: the result cache, the task publisher, the event reader on Redis).
"""

from ragline.api.pipeline.context import CacheSlot, Query, QueryContext, R
from ragline.api.pipeline.steps import Pipeline, error_of, splice

__all__ = ["CacheSlot", "Pipeline", "Query", "QueryContext", "R", "error_of", "splice"]
