"""An ingest job bounded and stoppable, on a real stack (an API with keys and an ingest worker,
MiniLM and FAISS): a document past its time limit fails alone with its reason while the rest of
its upload is indexed; a cancel stops a running ingest within seconds (the next job runs at once
on the same worker); a job past its own limit fails with the limit named."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from ragline.client import Client, JobFailed
from tests.helpers import Stack, redis_db_after, stack_on_db

pytestmark = pytest.mark.integration

INDEX = "limits"
DOCUMENT_TIMEOUT_S = 1.0
JOB_TIMEOUT_S = 20.0
# Several seconds to read on any machine here; a short document takes milliseconds.
SLOW_TEXT = ("steep the leaves and wait " * 40 + "\n\n") * 30_000


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    url = redis_db_after(settings.redis.redis_url, 4, "RAGLINE_TEST_INGEST_LIMITS_REDIS_URL")
    with stack_on_db(
        settings,
        url,
        ("ingest",),
        tmp_path_factory.mktemp("ingest-limits-logs"),
        home=tmp_path_factory.mktemp("ingest-limits-home"),
        auth_enabled=True,
        rate_limit_enabled=False,
        ingest_document_timeout_s=DOCUMENT_TIMEOUT_S,
        ingest_job_timeout_s=JOB_TIMEOUT_S,
    ) as running:
        key = apikeys.create(running.redis, Keys(running.settings.redis.key_prefix), "w", scopes=["admin"])[0]
        yield running, key


def _many(n: int) -> list[dict[str, str]]:
    """An upload that takes far longer to embed than to read: ``n`` documents of many chunks."""
    tag = uuid.uuid4().hex[:8]
    words = " ".join(f"w{tag}{i}" for i in range(3000))
    return [{"id": f"long-{tag}-{i}", "text": f"# Part {i}\n\n{words} {i}"} for i in range(n)]


def test_a_document_past_its_time_limit_fails_alone_with_its_reason(stack: tuple[Stack, str]) -> None:
    running, key = stack
    with Client(running.base, api_key=key) as rl:
        job = rl.upload(
            INDEX,
            files=[("tea.md", "# Tea\n\nSteep green tea for two minutes."), ("slow.txt", SLOW_TEXT)],
            timeout=120,
        )
        assert job.status == "done" and job.result is not None
        assert [(f.id, "RAGLINE_INGEST_DOCUMENT_TIMEOUT_S" in f.reason) for f in job.result.failed] == [
            ("slow.txt", True)
        ]
        assert running.settings.uploads_dir.as_posix() not in job.result.failed[0].reason
        assert {d.id for d in rl.documents(INDEX).documents} == {"tea.md"}
        # Alone in its upload, it fails the job, with the same reason.
        with pytest.raises(JobFailed) as failed:
            rl.upload(INDEX, files=[("slow.txt", SLOW_TEXT)], timeout=120)
        assert "'slow.txt'" in str(failed.value) and "RAGLINE_INGEST_DOCUMENT_TIMEOUT_S" in str(failed.value)


def test_a_cancel_stops_a_running_ingest_within_seconds(stack: tuple[Stack, str]) -> None:
    running, key = stack
    with Client(running.base, api_key=key) as rl:
        long = rl.upload(INDEX, documents=_many(40), wait=False)
        deadline = time.monotonic() + 60
        while (view := rl.job(long.job_id)).progress is None or view.progress.phase != "embedding":
            assert view.status in ("queued", "ingesting") and time.monotonic() < deadline, view
            time.sleep(0.2)
        assert rl.cancel_job(long.job_id).status == "cancelled"
        began = time.monotonic()
        # One ingest worker runs one job at a time: the next one runs once the cancelled one stopped.
        after = rl.upload(INDEX, documents=[{"id": "after", "text": "Kites fly on windy days."}], timeout=60)
        assert after.status == "done" and time.monotonic() - began < 10
        assert not any(d.id.startswith("long-") for d in rl.documents(INDEX, limit=1000).documents)


def test_a_job_past_its_time_limit_fails_with_the_limit_named(stack: tuple[Stack, str]) -> None:
    running, key = stack
    with Client(running.base, api_key=key) as rl:
        began = time.monotonic()
        with pytest.raises(JobFailed) as failed:
            rl.upload(INDEX, documents=_many(100), timeout=120)
        assert "RAGLINE_INGEST_JOB_TIMEOUT_S" in str(failed.value)
        assert time.monotonic() - began < JOB_TIMEOUT_S + 10
        assert not any(d.id.startswith("long-") for d in rl.documents(INDEX, limit=1000).documents)
