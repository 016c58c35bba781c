"""`ragline up` on the embedded Redis: everything becomes ready, Flower asks for its password,
and Ctrl-C stops every child process (the engine core included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from broker.settings import Settings
from tests.conftest import _free_port, env_for

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_up_embedded_redis_flower_auth_and_ctrl_c(
    settings: Settings, prepared_model: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(settings.models_dir.resolve(), target_is_directory=True)
    api_port, flower_port = _free_port(), _free_port()
    up_settings = settings.model_copy(
        update={
            "redis_url": f"redis://127.0.0.1:{_free_port()}/0",  # nothing listens: embedded Redis starts
            "home": home,
            "api_port": api_port,
            "flower_port": flower_port,
            "max_num_seqs": 2,
        }
    )
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "ragline", "up"],
        env=env_for(up_settings),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready in time"
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        names = {" ".join(p.cmdline()) for p in psutil.Process(up.pid).children(recursive=True)}
        assert any("redis-server" in n for n in names), names

        flower = f"http://127.0.0.1:{flower_port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(flower, timeout=2).status_code == 401
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        auth = (settings.flower_user, settings.flower_password)
        assert httpx.get(flower, auth=auth, timeout=5).status_code == 200

        descendants = psutil.Process(up.pid).children(recursive=True)
        assert len(descendants) >= 5  # redis, 2 workers (+ engine core), api, flower
        os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        assert up.wait(120) in (0, 130)
        _gone, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, [" ".join(p.cmdline()) for p in alive]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
