"""The one base of every exception ragline raises on purpose.

Each side derives its own from it: the API's :class:`~ragline.api.errors.ApiError` (what becomes a
4xx/5xx response), the workers' :class:`~ragline.workers.errors.WorkerError` (what ends or
reschedules a task), and the broker's own (the contract, limits, stored state). ``except
RaglineError`` tells ours from a library's; each keeps the standard exception it also is
(``ValueError``, ``TimeoutError``, ...), so callers that catch those still do.
"""


class RaglineError(Exception):
    """An error ragline raised on purpose."""
