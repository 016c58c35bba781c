"""The fuzz scenario of bench/faults.py: schemathesis (schema-valid cases, then any JSON body) over every
operation of the API's OpenAPI schema, each case with the headers a client may send
(``Authorization``, ``Idempotency-Key``, ``Last-Event-ID``, ``X-Request-Deadline-Ms``) drawn
from valid and hostile values. Counts 5xx other than 503, and 200 streams cut short."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FailedHealthCheck, Unsatisfiable
from schemathesis import GenerationMode

# The last event of a whole stream: ragline's final events, or the chat stream's end.
STREAM_ENDS = (b"event: done", b"event: error", b"data: [DONE]")
JUNK_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=6),
    max_leaves=20,
)
ODD_VALUES = [
    "",
    "0",
    "-1",
    "0-0",
    "1-0",
    "99999999999999999999-0",
    "١٢-٣",
    "²-1",
    "1e9",
    " ",
    "\u00ff" * 300,
]


@dataclass
class FuzzReport:
    operations: int = 0
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0  # 5xx other than 503, and no answer at all
    truncated_streams: int = 0
    examples: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # operation and mode that no case fits


def _header_values(valid: list[str]) -> st.SearchStrategy[bytes]:
    text = st.text(
        st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=60
    )
    return st.one_of(st.sampled_from(valid + ODD_VALUES), text, st.integers(-(10**20), 10**20).map(str)).map(
        lambda v: v.encode()
    )


def _ends_final(body: bytes) -> bool:
    marks = [line for line in body.splitlines() if line.startswith((b"event:", b"data: [DONE]"))]
    return bool(marks) and marks[-1].strip() in STREAM_ENDS


def _content_type(response: schemathesis.Response) -> str:
    value = {k.lower(): v for k, v in response.headers.items()}.get("content-type", "")
    return value[0] if isinstance(value, list) and value else str(value or "")


def fuzz_schema(base: str, headers: dict[str, str], *, max_examples: int) -> FuzzReport:
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    report = FuzzReport()
    session = requests.Session()
    extras = {
        "Authorization": _header_values(
            [headers["Authorization"]] * 6 + ["Bearer rl_not-a-key", "Basic eA=="]
        ),
        "Idempotency-Key": _header_values(["k-1", "k-1", "x" * 300]),
        "Last-Event-ID": _header_values(["0-0", "1-0", "1700000000000-0"]),
        "X-Request-Deadline-Ms": _header_values(["1", "1000", "30000", "0", "-5", "1e3"]),
    }
    sent_headers = st.fixed_dictionaries({}, optional=extras)  # type: ignore[arg-type]

    def record(what: str, status: int, body: bytes, content_type: str) -> None:
        report.cases += 1
        report.statuses[status] += 1
        if status >= 500 and status != 503:
            report.server_errors += 1
            report.examples.append(f"{what} → {status} {body[:120]!r}")
        elif status == 200 and content_type.startswith("text/event-stream") and not _ends_final(body):
            report.truncated_streams += 1
            report.examples.append(f"{what} → 200 stream without a final event: {body[-120:]!r}")

    for result in schema.get_all_operations():
        operation = result.ok()
        report.operations += 1
        # Schema-valid cases, then (where the operation takes a body) any JSON at all as its body:
        # wrong types, unknown fields, deep nesting, huge numbers.
        passes = [("positive", st.none())] + ([("any JSON body", JUNK_JSON)] if operation.body else [])
        for name, bodies in passes:

            @given(
                case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                extra=sent_headers,
                junk=bodies,
            )
            @settings(
                max_examples=max_examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def one(case: schemathesis.Case, extra: dict[str, bytes], junk: Any) -> None:
                if junk is not None:
                    case.body = junk
                sent = {"Authorization": headers["Authorization"], **(case.headers or {}), **extra}
                what = f"{case.method} {case.formatted_path}"
                try:
                    response = case.call(base_url=base, session=session, headers=sent, timeout=120)
                except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, ValueError):
                    return  # this client would not send it (a header value with a line break, say)
                except requests.exceptions.ChunkedEncodingError as exc:
                    report.cases += 1
                    report.truncated_streams += 1
                    report.examples.append(f"{what} → cut short: {exc}")
                    return
                except requests.exceptions.RequestException as exc:
                    report.cases += 1
                    report.server_errors += 1
                    report.examples.append(f"{what} → no answer: {type(exc).__name__}")
                    return
                record(what, response.status_code, response.content, _content_type(response))

            try:
                one()
            except (Unsatisfiable, FailedHealthCheck) as exc:
                report.skipped.append(f"{operation.label} {name}: {type(exc).__name__}")
    return report
