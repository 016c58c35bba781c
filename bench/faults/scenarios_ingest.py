"""bench/faults' ingest scenarios (issue 32): one key's uploads against every other key.

- ``ingest_quadratic_p99_ratio``: another key asks ``ingest_queries`` retrieval-only questions,
  one at a time, then as many again while a key uploads, one after another, Markdown documents
  whose heading line is 16 MiB of spaces (a shape whose reading was quadratic: hours of CPU for
  one MiB) → its P99 beside the uploads ≤ 1.5× its P99 before them.
- ``ingest_fair_jobs``: a key queues ``fair_jobs`` uploads (to an index of its own, some thirty
  chunks each), then another key uploads one document → its wait, from its upload to its job
  done, over the median time one of the first key's jobs ran: ≤ 2 (the job running when it came,
  then its own).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import httpx
from ragline.workers.priority import lower_priority

from bench.faults.scenarios_base import Durations, Result, Unique, query_body, wait_job
from bench.faults.stack import FaultStack
from bench.openloop import Sample, percentile, sequential

# A heading line this long (half the upload limit): the old heading rule took hours for 1 MiB of it
# (x4 per x2), a linear reader a second or so.
QUADRATIC_LINE = 16 << 20


def _upload(client: httpx.Client, headers: dict[str, str], index: str, name: str, text: str) -> str:
    """POST one file to ``index``; its job id."""
    reply = client.post(
        f"/v1/indexes/{index}/documents", files=[("files", (name, text.encode()))], headers=headers
    )
    reply.raise_for_status()
    job_id: str = reply.json()["job_id"]
    return job_id


def _at(view: dict[str, Any], status: str) -> float:
    """When the job entered ``status`` (unix seconds); nan when it did not."""
    stamp = view.get("timestamps", {}).get(status)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else float("nan")


# -- ingest_quadratic_p99_ratio -----------------------------------------------------------------


def _quadratic_document(i: int) -> str:
    return f"# {' ' * QUADRATIC_LINE}heading {i}\n\nThe hostile upload {i} has one short paragraph.\n"


def _from(body: Callable[[int], dict[str, Any]], start: int) -> Callable[[int], dict[str, Any]]:
    return lambda i: body(start + i)


def _hostile(base: str, headers: dict[str, str], index: str, enough: Event, sent: Queue[Any]) -> None:
    """Upload quadratic-shaped documents one after another until ``enough``; ``{}`` once each
    upload is sent, its final view once it ends, None at the end."""
    # This client stands for another host's: here it yields the two cores to the stack and to
    # the timed questions, in a session of its own so that the kernel's autogroups let its
    # priority count against theirs (workers/priority.py).
    os.setsid()
    lower_priority(19)
    with httpx.Client(base_url=base, timeout=240) as client:
        i = 0
        while not enough.is_set():
            body = _quadratic_document(i)
            sent.put({})
            job_id = _upload(client, headers, index, f"hostile-{i}.md", body)
            sent.put(wait_job(client, job_id, headers, 240))
            i += 1
    sent.put(None)


def ingest_quadratic(stack: FaultStack, d: Durations) -> Result:
    index = f"hostile-{uuid.uuid4().hex[:6]}"
    reader = stack.key("ingest-reader")
    writer = stack.key("ingest-hostile", scopes=(f"write:{index}",))
    ask = Unique("quadratic")
    url = stack.base + "/v1/query"

    def body(i: int) -> dict[str, Any]:
        return query_body(ask(i), mode="retrieval")

    sequential(url, n=10, body=body, headers=reader)  # warm-up: not counted
    alone = sequential(url, n=d.ingest_queries, body=lambda i: body(1000 + i), headers=reader)
    # The uploads come from a process of their own: in this one, building and sending 16 MiB
    # bodies would hold the GIL that the timed questions need, and count against the server.
    context = multiprocessing.get_context("spawn")
    enough, sent = context.Event(), context.Queue()
    uploads = context.Process(target=_hostile, args=(stack.base, writer, index, enough, sent), daemon=True)
    uploads.start()
    while sent.empty() and uploads.is_alive():  # the first upload is on its way
        time.sleep(0.01)
    # As many questions again, each sent while an upload is in flight (they follow one another).
    beside: list[Sample] = []
    while len(beside) < d.ingest_queries:
        beside += sequential(url, n=5, body=_from(body, 100_000 + len(beside)), headers=reader)
    enough.set()
    views: list[dict[str, Any]] = []
    while (view := sent.get(timeout=300)) is not None:
        if view:
            views.append(view)
    uploads.join(30)
    statuses = Counter(s.status for s in alone + beside)
    p99_alone = percentile([s.latency for s in alone], 99)
    p99_beside = percentile([s.latency for s in beside], 99)
    ratio = p99_beside / p99_alone
    jobs = Counter(v.get("status", "404") for v in views)
    ran = [_at(v, "done") - _at(v, "ingesting") for v in views if v.get("status") == "done"]
    ok = ratio <= 1.5 and set(statuses) == {200} and jobs.get("done", 0) == len(views) > 0
    detail = (
        f"retrieval P99 {p99_alone * 1000:.0f} ms alone ({len(alone)} questions), "
        f"{p99_beside * 1000:.0f} ms ({len(beside)}) beside {len(views)} uploads, one after another, "
        f"of a {QUADRATIC_LINE >> 20} MiB heading line of spaces ({dict(jobs)}; each job ran "
        f"{max(ran, default=float('nan')):.1f} s at most); statuses {dict(statuses)}"
    )
    return Result("ingest_quadratic_p99_ratio", round(ratio, 3), ok, detail)


# -- ingest_fair_jobs -----------------------------------------------------------------------------


def _note(tag: str, i: int) -> str:
    """A note of some thirty chunks: a job long enough that a turn's own overhead (the task's
    pickup, the job record's writes) is not what the figure measures."""
    words = " ".join(f"{tag}w{i}x{j}" for j in range(6000))
    return f"# Note {tag} {i}\n\nA note, number {i}, that one key uploads among many others. {words}\n"


def ingest_fair(stack: FaultStack, d: Durations) -> Result:
    tag = uuid.uuid4().hex[:6]
    busy_index, other_index = f"backlog-{tag}", f"other-{tag}"
    busy = stack.key("ingest-backlog", scopes=(f"write:{busy_index}",))
    other = stack.key("ingest-other", scopes=(f"write:{other_index}",))
    with httpx.Client(base_url=stack.base, timeout=120) as client:
        backlog = [_upload(client, busy, busy_index, f"n{i}.md", _note(tag, i)) for i in range(d.fair_jobs)]
        # Once two of the backlog's jobs are done (their timings known), the other key uploads.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(
            client.get(f"/v1/jobs/{j}", headers=busy).json()["status"] != "done" for j in backlog[:2]
        ):
            time.sleep(0.2)
        mine = _upload(client, other, other_index, "mine.md", _note("other", 0))
        view = wait_job(client, mine, other, 600)
        # What was left of the backlog is cancelled: the next scenario finds the queue empty.
        after = [client.get(f"/v1/jobs/{j}", headers=busy).json() for j in backlog]
        for job in after:
            if job["status"] in ("queued", "ingesting"):
                client.delete(f"/v1/jobs/{job['job_id']}", headers=busy)
    ran = [_at(v, "done") - _at(v, "ingesting") for v in after if v["status"] == "done"]
    one = statistics.median(ran) if ran else float("nan")
    waited = _at(view, "done") - _at(view, "queued")
    figure = waited / one
    done_before = sum(1 for v in after if v["status"] == "done" and _at(v, "done") <= _at(view, "done"))
    ok = view.get("status") == "done" and figure <= 2
    drained = time.monotonic() + 120
    while stack.redis.hlen(stack.keys.ingest_tasks) and time.monotonic() < drained:
        time.sleep(0.5)
    detail = (
        f"one key's {d.fair_jobs} uploads queued; the other key's upload {view.get('status')} "
        f"{waited:.2f} s after it was sent, one job running {one:.2f} s (median of {len(ran)}); "
        f"{done_before} of the backlog's jobs done before it"
    )
    return Result("ingest_fair_jobs", round(figure, 3), ok, detail)
