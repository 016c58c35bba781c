"""Record a trace of what admission predicts against what happens, from `ragline up` under mixed load.

    .venv/bin/python -m bench.predict_trace --out tests/broker/limits/data/mixed-NAME.json --note '...'

The stack `ragline up` starts (host defaults, eager engine so it starts in seconds) over the
Python FAQ (Debian's python3.11-doc), then three phases as bench/deployed.py's run them: a few
questions one at a time, 4 closed-loop RAG clients, then the same 4 clients beside an open loop
of retrieval-only requests (the mixed phase). Every request is recorded from the client's side:
when it was sent, when its sources came (retrieval done), when it was done, the worker's
timings (retrieval and generation seconds) and admission's live prediction. The estimator's
unit test (tests/broker/limits/test_prediction_trace.py) replays it.

A long deadline is sent so that admission degrades nothing: every request is a measurement of
both stages. Bounded in time; SIGTERM or Ctrl-C stops the stack.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.deployed import Questions, api_key, flush_result_cache, stack_env, start_up
from bench.env import share_models
from bench.retrieval import DEFAULT_DOCS, ensure_index, faq_labels, load_queries
from ragline.processes import interrupt_on_signals

INDEX = "pyfaq"
DEADLINE_MS = "180000"


class Recorder:
    def __init__(self) -> None:
        self.zero = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.monotonic() - self.zero, 4)

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.append(row)


def ask(
    client: httpx.Client, base: str, headers: dict[str, str], question: str, rec: Recorder, phase: str
) -> None:
    row: dict[str, Any] = {"mode": "rag", "phase": phase, "sent": rec.now(), "status": 0}
    try:
        with client.stream("POST", base + "/v1/query/stream", json={"query": question}, headers=headers) as r:
            row["status"] = r.status_code
            event = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    if event == "sources":
                        row["sources_at"] = rec.now()
                    elif event in ("done", "error"):
                        row["done_at"] = rec.now()
                        data = json.loads(line[5:])
                        row["degraded"] = bool(data.get("degraded"))
                        row["timings"] = data.get("timings") or {}
                        row["completion_tokens"] = (data.get("usage") or {}).get("completion_tokens", 0)
                        if event == "error":
                            row["status"] = int(data.get("status", 500))
                        break
    except httpx.HTTPError:
        row["status"] = -1
    rec.add(row)


def rag_clients(
    base: str,
    headers: dict[str, str],
    questions: Questions,
    n: int,
    duration_s: float,
    rec: Recorder,
    phase: str,
) -> None:
    start = time.monotonic()

    def loop() -> None:
        with httpx.Client(timeout=300) as client:
            while time.monotonic() - start < duration_s:
                ask(client, base, headers, questions.next(), rec, phase)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def retrieval_open_loop(
    base: str, headers: dict[str, str], questions: Questions, rate: float, duration_s: float, rec: Recorder
) -> None:
    """Retrieval-only requests sent at ``rate`` from a few threads (each on its own schedule)."""
    threads_n = 4
    start = time.monotonic()

    def loop(k: int) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while True:
                due = start + (i * threads_n + k) / rate
                if due - start >= duration_s:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                row: dict[str, Any] = {"mode": "retrieval", "phase": "mixed", "sent": rec.now(), "status": 0}
                try:
                    r = client.post(
                        base + "/v1/query",
                        json={"query": questions.next(), "mode": "retrieval"},
                        headers=headers,
                    )
                    row["status"] = r.status_code
                    row["done_at"] = rec.now()
                    if r.status_code == 200:
                        row["timings"] = r.json().get("timings") or {}
                except httpx.HTTPError:
                    row["status"] = -1
                rec.add(row)
                i += 1

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def to_trace(rows: list[dict[str, Any]], slots: int, note: str = "") -> dict[str, Any]:
    """Each answered request as the replay reads it: when it arrived, when each stage ran (seconds
    from the recording's start), its retrieval batch, when its answer was in, and admission's live
    prediction. A stage's start is its end less the seconds the worker timed it (``timings``); a
    retrieval batch is the requests that report one batch's time."""
    batches: dict[float, int] = {}
    out = []
    for row in rows:
        timings = row.get("timings") or {}
        if row["status"] != 200 or row.get("degraded") or "done_at" not in row or not timings:
            continue
        done = row["done_at"]
        retrieval_end = row.get("sources_at", done)
        retrieval_s = timings.get("retrieval_ms", 0.0) / 1000
        request: dict[str, Any] = {
            "mode": row["mode"],
            "phase": row["phase"],
            "arrive": row["sent"],
            "retrieval": [round(retrieval_end - retrieval_s, 4), retrieval_end],
            "batch": batches.setdefault(timings.get("retrieval_ms", 0.0), len(batches)),
            "done": done,
        }
        if row["mode"] == "rag":
            request["generation"] = [round(done - timings.get("generation_ms", 0.0) / 1000, 4), done]
            request["tokens"] = row.get("completion_tokens", 0)
        if timings.get("predicted_wait_ms") is not None:
            request["predicted"] = round(timings["predicted_wait_ms"] / 1000, 4)
        out.append(request)
    return {"recorded": note, "slots": slots, "workers": 1, "requests": out}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="where and how it was recorded (kept in the trace)")
    parser.add_argument("--lone", type=int, default=3)
    parser.add_argument("--alone-s", type=float, default=60)
    parser.add_argument("--mixed-s", type=float, default=120)
    parser.add_argument(
        "--retrieval-rate", type=float, default=4.0, help="retrieval-only requests per second"
    )
    args = parser.parse_args()
    args.eager = True  # stack_env's: an eager engine starts in seconds; the trace is about timing, not speed
    interrupt_on_signals()
    share_models(args.home)
    import redis
    from ragline.broker.config.settings import Settings
    from ragline.workers.generation.model_prep import prepare_default_model

    redis.Redis.from_url(args.redis_url).flushdb()
    settings = Settings().replace(home=args.home, redis_url=args.redis_url, default_index=INDEX)
    prepare_default_model(settings)
    ensure_index(settings, args.docs / "faq", index=INDEX)
    faq = [q for q, _, _ in faq_labels(args.docs)]
    load = Questions(load_queries(settings, index=INDEX))
    rag = Questions(faq)
    headers = api_key(args.redis_url) | {"X-Request-Deadline-Ms": DEADLINE_MS}
    env, port = stack_env(args, INDEX)
    log = Path(tempfile.gettempdir()) / "predict-trace-up.log"
    print(f"starting ragline up (its log: {log})", flush=True)
    up = start_up(env, log, port)
    rec = Recorder()
    try:
        flush_result_cache(args.redis_url)
        print("lone", flush=True)
        with httpx.Client(timeout=300) as client:
            for _ in range(args.lone):
                ask(client, up.base, headers, rag.next(), rec, "lone")
        print("4 RAG clients", flush=True)
        rag_clients(up.base, headers, rag, 4, args.alone_s, rec, "alone")
        print("mixed", flush=True)
        mixed = threading.Thread(
            target=rag_clients, args=(up.base, headers, rag, 4, args.mixed_s, rec, "mixed"), daemon=True
        )
        mixed.start()
        retrieval_open_loop(up.base, headers, load, args.retrieval_rate, args.mixed_s, rec)
        mixed.join()
    finally:
        up.stop()
    rows = sorted(rec.rows, key=lambda r: r["sent"])
    slots = int(
        redis.Redis.from_url(args.redis_url).hget(f"{settings.redis.key_prefix}:done:generation", "slots")
        or 1
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trace = to_trace(rows, slots, args.note)
    # One request a line: a diff of a new recording reads as one.
    lines = ",\n".join(json.dumps(r, separators=(",", ":")) for r in trace.pop("requests"))
    args.out.write_text(json.dumps(trace)[:-1] + ', "requests": [\n' + lines + "\n]}\n")
    print(f"{len(rows)} requests recorded, written to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
