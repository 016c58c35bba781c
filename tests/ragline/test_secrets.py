"""No defaults in production, on real processes: the API, the callbacks worker, Flower and
``ragline up`` refuse to start on the development webhook secret or a guessable Flower password,
unless dev mode is on; Flower listens on loopback only."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from ragline.broker.config.settings import DEV_WEBHOOK_SECRET, Settings

from ragline import processes
from tests.helpers import env_for, free_port

pytestmark = pytest.mark.integration

RAGLINE = [sys.executable, "-m", "ragline"]


def _run(cmd: list[str], settings: Settings, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=env_for(settings), capture_output=True, text=True, timeout=timeout, check=False
    )


@contextmanager
def _started(cmd: list[str], settings: Settings, log: Path) -> Iterator[psutil.Process]:
    with processes.Supervisor(grace_s=5.0) as sup, log.open("ab") as out:
        child = sup.start("under-test", cmd, env_for(settings), stdout=out)
        yield psutil.Process(child.proc.pid)
        assert child.proc.poll() is None, log.read_text()[-3000:]


def _wait_http(url: str, log: Path, ok: tuple[int, ...] = (200,), timeout: float = 90) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = httpx.get(url, timeout=2)
            if reply.status_code in ok:
                return reply
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def _public(settings: Settings) -> Settings:
    """What a production box that never set its secrets runs with."""
    return settings.replace(webhook_secret=DEV_WEBHOOK_SECRET, flower_password="ragline", dev_mode=False)


def _command(how: str, settings: Settings) -> list[str]:
    return {
        "ragline-api": [*RAGLINE, "api"],
        # uvicorn on its own (no `ragline` in front): the app factory refuses.
        "uvicorn": processes.api_command(settings.api),
        "ragline-worker-callbacks": [*RAGLINE, "worker", "callbacks"],
        # Celery on its own: the worker refuses at worker_init.
        "celery-worker": processes.worker_command("callbacks", settings),
    }[how]


@pytest.mark.parametrize("how", ["ragline-api", "uvicorn", "ragline-worker-callbacks", "celery-worker"])
def test_refuses_the_development_webhook_secret(settings: Settings, how: str) -> None:
    public = _public(settings).replace(api_port=free_port())
    try:
        done = _run(_command(how, public), public, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{how} started on the development webhook secret")
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RAGLINE_WEBHOOK_SECRET is the development default" in done.stderr + done.stdout
    assert "RAGLINE_DEV_MODE" in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("password", "why"),
    [("ragline", "well-known default"), ("Change-Me", "well-known default"), ("short-pw", "shorter than 12")],
)
def test_flower_refuses_a_guessable_password(settings: Settings, password: str, why: str) -> None:
    weak = settings.replace(flower_password=password, flower_port=free_port())
    done = _run([*RAGLINE, "flower"], weak, timeout=60)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"RAGLINE_FLOWER_PASSWORD {'is a ' if 'known' in why else 'is '}{why}" in done.stderr


def test_up_refuses_a_weak_secret_before_starting_anything(settings: Settings, tmp_path: Path) -> None:
    weak = settings.replace(home=tmp_path, flower_password="admin")
    done = _run([*RAGLINE, "up"], weak, timeout=60)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RAGLINE_FLOWER_PASSWORD is a well-known default" in done.stderr
    assert "starting an embedded one" not in done.stderr  # nothing was started


def test_dev_mode_starts_the_api_on_defaults(settings: Settings, tmp_path: Path) -> None:
    dev = _public(settings).replace(dev_mode=True, api_port=free_port())
    with _started([*RAGLINE, "api"], dev, tmp_path / "api.log"):
        _wait_http(f"http://127.0.0.1:{dev.api.api_port}/healthz", tmp_path / "api.log")


def test_flower_with_a_real_password_listens_on_loopback_only(settings: Settings, tmp_path: Path) -> None:
    real = settings.replace(flower_password="a-real-flower-password", flower_port=free_port())
    log = tmp_path / "flower.log"
    with _started([*RAGLINE, "flower"], real, log) as flower:
        base = f"http://127.0.0.1:{real.flower.flower_port}/"
        _wait_http(base, log, ok=(401,))
        assert (
            httpx.get(
                base, auth=(real.flower.flower_user, real.flower.flower_password), timeout=5
            ).status_code
            == 200
        )
        family = [flower, *flower.children(recursive=True)]
        listening = {
            c.laddr.ip for p in family for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, listening
