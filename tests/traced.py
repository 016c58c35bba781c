"""Spans a test records in its own process (OpenTelemetry's in-memory exporter), and spans read
back from the JSON lines that processes of a stack append to one file (the console exporter's
format, ``broker/tracing/json_lines.py``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragline.broker import tracing


@contextlib.contextmanager
def recording(service: str = "test") -> Iterator[InMemorySpanExporter]:
    """Trace into memory (each span exported as it ends) until the block ends, then off again."""
    exporter = InMemorySpanExporter()
    tracing.install(exporter, service, batched=False)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def named(spans: Iterator[ReadableSpan] | tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


@dataclass(frozen=True)
class Exported:
    """One span as the console exporter wrote it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    service: str
    attributes: dict[str, Any]
    links: list[dict[str, Any]]
    start: str
    end: str

    @classmethod
    def of(cls, line: str) -> Exported:
        raw = json.loads(line)
        return cls(
            name=raw["name"],
            trace_id=raw["context"]["trace_id"],
            span_id=raw["context"]["span_id"],
            parent_id=raw["parent_id"],
            kind=raw["kind"],
            service=raw["resource"]["attributes"]["service.name"],
            attributes=raw["attributes"] or {},
            links=raw["links"],
            start=raw["start_time"],
            end=raw["end_time"],
        )

    def linked_to(self) -> set[str]:
        return {link["context"]["span_id"] for link in self.links}


def exported(path: Path) -> list[Exported]:
    """Every whole line of ``path`` (one still being written is left for the next read)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [Exported.of(line) for line in text.split("\n")[:-1] if line]
