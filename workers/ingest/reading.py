"""Reading uploaded documents in a child process, each within its time limit.

A parser runs in the thread that called it and cannot be interrupted there, so the ingest worker
reads and chunks each staged document in a child of its own (started with ``spawn``: a clean
interpreter, none of the parent's threads or encoder), which is killed when a document passes
``ingest_document_timeout_s``. That document fails alone (:class:`DocumentFailed`, whose reason
the job's result lists) and a new child reads the next one. The child outlives documents and
jobs: its start (an interpreter and the readers' imports) is paid once, not counted against any
document's limit, and again only after a kill.

The watch thread (``workers/ingest/watch.py``) stops the child too, on a cancel or at the job's
limit: the read in progress then raises :class:`ReaderStopped`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from ragline.broker.limits.metadata import MetadataRefused
from ragline.workers.errors import WorkerError
from ragline.workers.retrieval.chunking import Chunk, ChunkShape, chunk_document
from ragline.workers.retrieval.readers import read_document

log = logging.getLogger(__name__)

# How long a new child may take to import the readers; not a document's time.
_START_TIMEOUT_S = 120.0
# How far below the worker the child's CPU priority goes (nice(2) increments; 19 is the lowest).
_NICENESS = 10


class DocumentFailed(WorkerError):
    """This document is left out of its upload; ``reason`` says why (no path on the server)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ReaderStopped(WorkerError):
    """The child was stopped from outside (a cancel, the job's limit) while it read."""


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """What the child reads: a staged file, as the document ``source`` with ``metadata``."""

    path: str
    source: str
    metadata: dict[str, str]
    shape: ChunkShape


# The child's replies: ("ready",), ("chunks", list[Chunk]), ("refused", status, message),
# ("error", exception name).
Reply = tuple[object, ...]


def _serve(conn: Connection) -> None:
    """The child: read each request into chunks until the parent closes its end."""
    # A tenant's document is batch work: on cores shared with the retrieval workers, its parse
    # yields to the queries.
    with contextlib.suppress(OSError):
        os.nice(_NICENESS)
    conn.send(("ready",))
    while True:
        try:
            request: ReadRequest = conn.recv()
        except EOFError:
            return
        reply: Reply
        try:
            document = read_document(Path(request.path))
            chunks = chunk_document(
                document,
                source=request.source,
                path=request.source,
                metadata=request.metadata,
                shape=request.shape,
            )
            reply = ("chunks", chunks)
        except MetadataRefused as exc:
            reply = ("refused", exc.status, exc.message)
        except Exception as exc:  # reported by name only: a message could carry a server path
            reply = ("error", type(exc).__name__)
        conn.send(reply)


class ReaderProcess:
    """A child that reads documents, one at a time, each within ``timeout_s``; thread-safe
    :meth:`stop` for the watch thread."""

    def __init__(self, *, timeout_s: float, start_timeout_s: float = _START_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def read(self, path: Path, *, source: str, metadata: dict[str, str], shape: ChunkShape) -> list[Chunk]:
        """The chunks of the staged file ``path``. Raises DocumentFailed (past the limit, or the
        reader failed), MetadataRefused (its front matter breaks a limit), ReaderStopped (since
        :meth:`stop`, until :meth:`rearm`)."""
        conn = self._ready()
        try:
            conn.send(ReadRequest(str(path), source, metadata, shape))
            if not conn.poll(self.timeout_s):
                self._kill()
                limit = f"{self.timeout_s:g} s (RAGLINE_INGEST_DOCUMENT_TIMEOUT_S)"
                raise DocumentFailed(f"not read within its time limit of {limit}")
            reply = conn.recv()
        except (EOFError, OSError):  # the child is gone: killed by stop(), or it died
            stopped = self._stopped
            code = self._kill()
            if stopped:
                raise ReaderStopped from None
            raise DocumentFailed(f"its reader stopped while reading it (exit code {code})") from None
        if reply[0] == "chunks":
            chunks: list[Chunk] = reply[1]
            return chunks
        if reply[0] == "refused":
            raise MetadataRefused(int(str(reply[1])), str(reply[2]))
        raise DocumentFailed(f"it could not be read ({reply[1]})")

    @property
    def pid(self) -> int | None:
        """The child's process id; None while none runs."""
        process = self._process
        return process.pid if process is not None else None

    def rearm(self) -> None:
        """A job begins: reads go on again after an earlier job's :meth:`stop`."""
        with self._lock:
            self._stopped = False

    def stop(self) -> None:
        """Kill the child now (from any thread): the read in progress, and every read until
        :meth:`rearm`, raises ReaderStopped."""
        with self._lock:
            self._stopped = True
            if self._process is not None:
                self._process.kill()

    def close(self) -> None:
        self._kill()

    def _ready(self) -> Connection:
        with self._lock:
            if self._stopped:
                raise ReaderStopped
            if self._conn is not None and self._process is not None and self._process.is_alive():
                return self._conn
        self._kill()
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(child,), name="ragline-reader", daemon=True)
        with self._lock:
            if self._stopped:
                raise ReaderStopped
            process.start()
            self._process, self._conn = process, parent
        child.close()
        try:
            if not parent.poll(self.start_timeout_s):
                self._kill()
                raise RuntimeError(f"the document reader did not start within {self.start_timeout_s:g} s")
            parent.recv()  # ("ready",)
        except (EOFError, OSError):
            stopped = self._stopped
            self._kill()
            if stopped:
                raise ReaderStopped from None
            raise RuntimeError("the document reader exited as it started") from None
        return parent

    def _kill(self) -> int | None:
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        process.kill()
        process.join(5)
        return process.exitcode
