"""The workers' exception base: every error a worker raises on purpose derives from it."""

from ragline.broker.errors import RaglineError


class WorkerError(RaglineError):
    """An error a worker raised on purpose (a task ended, rescheduled or refused, an engine gone)."""
