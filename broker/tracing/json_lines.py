"""The console exporter's JSON, one span a line, appended to a file or written to stdout.

Imported only once tracing is on in console mode (``setup.configure``): it loads OpenTelemetry's SDK.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLines(SpanExporter):
    """Each span in one ``write`` to a descriptor opened for appending, so that processes may
    share the file: a buffered file would write a batch in pieces of its buffer's size, wherever
    they fall, and another process's line could land inside one. ``path`` empty: stdout."""

    def __init__(self, path: str = "") -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        fd = sys.stdout.fileno() if self._fd is None else self._fd
        for span in spans:
            _write_all(fd, (span.to_json(indent=None) + "\n").encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
