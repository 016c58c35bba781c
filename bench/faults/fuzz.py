"""The fuzz scenario of bench/faults/run.py: schemathesis (schema-valid cases, then any JSON body) over every
operation of the API's OpenAPI schema, each case with the headers a client may send
(``Authorization``, ``Idempotency-Key``, ``Last-Event-ID``, ``X-Request-Deadline-Ms``) drawn
from valid and hostile values; the document endpoints half the time on an index the key may write,
so that uploads get past the scope check. Then uploads of hostile shape (multipart and JSON):
file names and ids of every length and spelling, metadata nested deep or of the wrong type, bodies
without a JSON type. Counts 5xx other than 503, 200 streams cut short, and the accepted upload
jobs that the ingest worker then failed with a 5xx."""

from __future__ import annotations

import contextlib
import json
import time
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


# The index the fuzz key may write (scope write:FUZZ_INDEX), beside any name the schema draws.
FUZZ_INDEX = "fuzz-docs"
DOCUMENT_PATHS = "/v1/indexes/{name}"
NAMED_SHAPES = [
    ".md",
    ".rst.txt",
    "..md",
    " .txt",
    "n" * 253 + ".md",
    "n" * 254 + ".md",
    "é" * 250 + ".txt",
    "x" * 2000 + ".md",
    "../../etc/passwd.md",
    "a/b/c.html",
    "a\\b.md",
    "CON.txt",
    "report.pdf",
    "\u202egnp.md",
    "tab\there.rst",
    "notes.RST.TXT",
    "",
]
SUFFIXES = [".txt", ".md", ".rst", ".rst.txt", ".html", ".htm", ".pdf", ""]
READ_SUFFIXES = st.sampled_from(SUFFIXES[:6])
# Printable stems of any length up to the limit and past it, so that many uploads are accepted and
# their content reaches the ingest worker.
PRINTABLE = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=260
)
FILE_NAMES = st.one_of(
    st.sampled_from(NAMED_SHAPES),
    st.builds(lambda stem, suffix: stem + suffix, st.text(max_size=300), st.sampled_from(SUFFIXES)),
    st.builds(lambda stem, suffix: stem + suffix, PRINTABLE, READ_SUFFIXES),
    st.builds(lambda stem, suffix: stem + suffix, PRINTABLE, READ_SUFFIXES),
)
DEPTHS = st.sampled_from([1, 50, 200, 1_000, 100_000])
METADATA = st.one_of(
    st.none(),
    st.none(),
    st.dictionaries(st.text(max_size=30), st.text(max_size=60), max_size=5).map(json.dumps),
    JUNK_JSON.map(json.dumps),
    DEPTHS.map(lambda d: "[" * d + "]" * d),
    DEPTHS.map(lambda d: '{"a": ' * d + '"x"' + "}" * d),
    st.text(max_size=80),
)
CONTENTS = st.one_of(
    st.binary(max_size=2_000),
    st.text(max_size=2_000).map(str.encode),
    st.sampled_from(["#", "<", "[", "`", " ", "---\n"]).map(lambda c: (c * 20_000).encode()),
)


@dataclass
class FuzzReport:
    operations: int = 0
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0  # 5xx other than 503, and no answer at all
    truncated_streams: int = 0
    examples: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # operation and mode that no case fits
    jobs: list[str] = field(default_factory=list)  # accepted uploads, to be looked at once done
    failed_jobs: int = 0  # those the ingest worker failed with a 5xx other than 503

    def record(self, what: str, status: int, body: bytes, content_type: str) -> None:
        self.cases += 1
        self.statuses[status] += 1
        if status >= 500 and status != 503:
            self.server_errors += 1
            self.examples.append(f"{what} → {status} {body[:120]!r}")
        elif status == 200 and content_type.startswith("text/event-stream") and not _ends_final(body):
            self.truncated_streams += 1
            self.examples.append(f"{what} → 200 stream without a final event: {body[-120:]!r}")
        elif status == 202 and what.startswith("POST /v1/indexes/"):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.jobs.append(str(json.loads(body)["job_id"]))


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


def _content_type(response: schemathesis.Response | requests.Response) -> str:
    value = {k.lower(): v for k, v in response.headers.items()}.get("content-type", "")
    return value[0] if isinstance(value, list) and value else str(value or "")


def fuzz_schema(base: str, headers: dict[str, str], *, max_examples: int) -> FuzzReport:
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    # Schemathesis stops reading an event stream after 20 events by default: an answer's tokens
    # are more, and a stream it cut would pass for one the server ended without a final event.
    schema.config.max_stream_events = 100_000
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
    sent_headers = st.fixed_dictionaries({}, optional=extras)

    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err (an operation it cannot read) fails here, loudly
        report.operations += 1
        # Schema-valid cases, then (where the operation takes a body) any JSON at all as its body:
        # wrong types, unknown fields, deep nesting, huge numbers.
        passes = [("positive", st.none())] + ([("any JSON body", JUNK_JSON)] if operation.body else [])
        for name, bodies in passes:

            @given(
                case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                extra=sent_headers,
                junk=bodies,
                writable=st.booleans(),
            )
            @settings(
                max_examples=max_examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def one(case: schemathesis.Case, extra: dict[str, bytes], junk: Any, writable: bool) -> None:
                if junk is not None:
                    case.body = junk
                # Called below, in this same iteration: `operation` is this one.
                documents = operation.path.startswith(DOCUMENT_PATHS)  # noqa: B023
                if writable and documents and case.path_parameters:
                    case.path_parameters["name"] = FUZZ_INDEX
                sent = {"Authorization": headers["Authorization"], **dict(case.headers or {}), **extra}
                what = f"{case.method} {case.formatted_path}"
                try:
                    response = case.call(base_url=base, session=session, headers=sent, timeout=120)
                except (
                    requests.exceptions.InvalidHeader,
                    requests.exceptions.InvalidURL,
                    requests.exceptions.InvalidJSONError,  # NaN or infinity: not JSON it will write
                    ValueError,
                ):
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
                if getattr(response, "stream_cut_short", False):  # this client stopped reading
                    report.cases += 1
                    report.statuses[response.status_code] += 1
                    return
                report.record(what, response.status_code, response.content, _content_type(response))

            try:
                one()
            except (Unsatisfiable, FailedHealthCheck) as exc:
                report.skipped.append(f"{operation.label} {name}: {type(exc).__name__}")
    fuzz_uploads(base, headers, report, session, max_examples=max_examples * 10)
    return report


def fuzz_uploads(
    base: str, headers: dict[str, str], report: FuzzReport, session: requests.Session, *, max_examples: int
) -> None:
    """Uploads to the fuzz index of hostile shape: multipart files with any name and content and
    metadata of any shape; JSON documents with any id; either with a type that is not theirs."""
    url = f"{base}/v1/indexes/{FUZZ_INDEX}/documents"
    files = st.lists(st.tuples(FILE_NAMES, CONTENTS), min_size=1, max_size=3)
    json_documents = st.lists(
        st.fixed_dictionaries(
            {"id": FILE_NAMES, "text": st.text(max_size=500)},
            optional={"format": st.sampled_from(["txt", "md", "rst", "html", "pdf"]), "metadata": JUNK_JSON},
        ),
        min_size=1,
        max_size=3,
    )
    types = st.sampled_from(
        [
            None,
            "application/json",
            "application/json",
            "application/json",
            "text/plain",
            "multipart/form-data",
        ]
    )

    @given(
        kind=st.sampled_from(["multipart", "json"]),
        parts=files,
        docs=json_documents,
        meta=METADATA,
        sent_as=types,
    )
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def one(
        kind: str,
        parts: list[tuple[str, bytes]],
        docs: list[dict[str, Any]],
        meta: str | None,
        sent_as: str | None,
    ) -> None:
        what = f"POST /v1/indexes/{FUZZ_INDEX}/documents ({kind})"
        try:
            if kind == "multipart":
                form = {"metadata": meta} if meta is not None else {}
                response = session.post(
                    url, files=[("files", p) for p in parts], data=form, headers=headers, timeout=120
                )
            else:
                sent = dict(headers) | ({"Content-Type": sent_as} if sent_as else {})
                body = json.dumps({"documents": docs}).encode()
                response = session.post(url, data=body, headers=sent, timeout=120)
        except (requests.exceptions.InvalidHeader, ValueError):
            return  # this client would not send it
        except requests.exceptions.RequestException as exc:
            report.cases += 1
            report.server_errors += 1
            report.examples.append(f"{what} → no answer: {type(exc).__name__}")
            return
        report.record(what, response.status_code, response.content, _content_type(response))

    one()


def failed_jobs(base: str, headers: dict[str, str], report: FuzzReport, *, timeout_s: float) -> int:
    """How many of the accepted uploads the ingest worker failed with a 5xx other than 503,
    looked at once each is finished (or ``timeout_s`` has passed: one still running counts too)."""
    deadline = time.monotonic() + timeout_s
    pending, failed = list(report.jobs), 0
    with requests.Session() as session:
        while pending and time.monotonic() < deadline:
            still = []
            for job_id in pending:
                record = session.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=30).json()
                if record.get("status") not in ("done", "failed", "cancelled"):
                    still.append(job_id)
                    continue
                status = (record.get("error") or {}).get("status", 0)
                if status >= 500 and status != 503:
                    failed += 1
                    report.examples.append(f"job {job_id} failed: {record['error']}"[:200])
            pending = still
            if pending:
                time.sleep(1.0)
    for job_id in pending:
        report.examples.append(f"job {job_id} not finished within {timeout_s:.0f} s")
    return failed + len(pending)
