"""``ragline demo``: the whole path on a corpus every Python has (pydoc's language topics)."""

from __future__ import annotations

import logging
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ragline.broker.config.settings import Settings
from ragline.client import APIError, Client, QueryResponse
from ragline.stack import running_stack

log = logging.getLogger("ragline")

DEMO_INDEX = "demo"
QUESTIONS = (
    "What does the assert statement do?",
    "What does the global statement do?",
    "How does a with statement use a context manager?",
)


def write_demo_corpus(dest: Path) -> int:
    """pydoc's help topics (the language reference in plain text) as one file per topic."""
    from pydoc_data.topics import topics

    for name, text in topics.items():
        (dest / f"{name}.txt").write_text(text)
    return len(topics)


def _in_thread(work: Callable[[], object]) -> None:
    """Run ``work`` in a thread of its own and wait for it in short steps. A signal's
    KeyboardInterrupt reaches the main thread only between bytecodes: inside an embedding batch
    it came seconds late, and stopping on SIGTERM overran its bound. Interrupted, the work is left
    to die with the process (an ingest swaps its index in only once it is complete)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="demo-ingest", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failed:
        raise failed[0]


def run_demo(settings: Settings) -> int:
    from ragline.workers.retrieval.ingest import ingest

    # The demo's API runs without API keys, on 127.0.0.1, for the length of the demo, and on
    # development secrets (dev mode).
    log.warning("the demo runs its API without API keys (RAGLINE_AUTH_ENABLED=false), in dev mode")
    settings = settings.replace(auth_enabled=False, dev_mode=True)
    with running_stack(settings, flower=True) as stack:
        with tempfile.TemporaryDirectory(prefix="ragline-demo-") as tmp:
            n = write_demo_corpus(Path(tmp))
            print(f"ingesting {n} pydoc topics into index {DEMO_INDEX!r}", flush=True)
            _in_thread(lambda: ingest(stack.settings, [Path(tmp)], index_name=DEMO_INDEX))
        print("waiting for the workers (the vLLM engine takes a minute or two to start)", flush=True)
        stack.wait_ready()
        with Client(stack.api_base, timeout=settings.api.request_timeout_s + 10) as client:
            for question in QUESTIONS:
                started = time.perf_counter()
                try:
                    answer = client.query(question, index=DEMO_INDEX, top_k=3)
                except APIError as exc:
                    print(f"\nQ: {question}\n   failed: {exc}")
                    return 1
                print_answer(question, answer, client_ms=1000 * (time.perf_counter() - started))
        print("\ndemo done; stopping ragline", flush=True)
    return 0


def print_answer(question: str, answer: QueryResponse, *, client_ms: float) -> None:
    t = answer.timings
    print(f"\nQ: {question}")
    # Under load admission control may answer with the sources only; say so plainly.
    text = answer.answer if answer.answer is not None else f"({answer.notice})"
    print(textwrap.fill(f"A: {text}", width=100, subsequent_indent="   "))
    for s in answer.sources:
        anchor = f"#{s.anchor}" if s.anchor else ""
        print(f"   - [{s.score:.2f}] {s.title} ({Path(s.source).name}{anchor})")
    print(
        f"   timings: queue {t.queue_ms:.0f} ms, retrieval {t.retrieval_ms:.0f} ms, "
        f"generation {t.generation_ms:.0f} ms, total {t.total_ms:.0f} ms (client {client_ms:.0f} ms)"
    )
