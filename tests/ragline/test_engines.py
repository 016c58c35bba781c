"""`ragline worker generation --gpus`: one worker process per engine, each pinned to its GPUs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ragline.broker.config import host
from ragline.broker.config.gpus import Gpu
from ragline.broker.config.settings import Settings

from ragline import cli, processes
from ragline.placement import Placement

FOUR = tuple(Gpu(i, "NVIDIA H200", 143_771, 4, (9, 0)) for i in range(4))


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    here = host.detect()
    monkeypatch.setattr(
        host, "detect", lambda: host.Host(here.cores, here.memory_bytes, here.cpu_flags, FOUR)
    )


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the command would run instead of running it: the exec'd worker, or the engines."""
    seen: dict[str, Any] = {}

    def exec_(cmd: list[str], env: dict[str, str]) -> int:
        seen["exec"] = (cmd, env)
        return 0

    def run_engines(settings: Settings, placements: list[Placement]) -> int:
        seen["engines"] = placements
        return 0

    monkeypatch.setattr(cli, "_exec", exec_)
    monkeypatch.setattr(processes, "run_engines", run_engines)
    return seen


def _worker(settings: Settings, *argv: str) -> int:
    args = cli.build_parser().parse_args(["worker", *argv])
    return int(args.func(args, settings))


@pytest.mark.usefixtures("four_gpus")
def test_several_gpus_are_several_supervised_engines(tmp_path: Path, started: dict[str, Any]) -> None:
    settings = Settings().replace(home=tmp_path)
    assert _worker(settings, "generation", "--gpus", "1,3") == 0
    assert started["engines"] == [Placement((1,)), Placement((3,))]
    assert _worker(settings.replace(tensor_parallel=2), "generation") == 0  # RAGLINE_GPUS=all
    assert started["engines"] == [Placement((0, 1)), Placement((2, 3))]


@pytest.mark.usefixtures("four_gpus")
def test_one_engine_is_this_process_pinned_to_its_gpu(tmp_path: Path, started: dict[str, Any]) -> None:
    assert _worker(Settings().replace(home=tmp_path, gpus="2"), "generation") == 0
    cmd, env = started["exec"]
    assert "generation" in cmd and any(a.startswith("generation-worker-gpu2-") for a in cmd)
    assert (env["CUDA_VISIBLE_DEVICES"], env["RAGLINE_ENGINE_GPUS"]) == ("2", "2")
    assert "engines" not in started


@pytest.mark.usefixtures("four_gpus")
def test_gpus_that_are_not_there_are_refused(
    tmp_path: Path, started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _worker(Settings().replace(home=tmp_path), "generation", "--gpus", "4") == 2
    assert "no GPU 4 here" in capsys.readouterr().err
    assert _worker(Settings().replace(home=tmp_path), "retrieval", "--gpus", "0") == 2
    assert "--gpus is for generation workers" in capsys.readouterr().err
    assert not started


def test_each_engine_serves_its_metrics_on_a_port_of_its_own() -> None:
    settings = Settings().replace(worker_metrics_port=9100)
    envs = [processes.generation_env(settings, Placement((i,)), position=i, engines=2) for i in range(2)]
    assert [e["RAGLINE_WORKER_METRICS_PORT"] for e in envs] == ["9100", "9101"]
    alone = processes.generation_env(settings, Placement((0,)))
    assert alone.get("RAGLINE_WORKER_METRICS_PORT", "9100") == "9100"


@pytest.mark.slow  # a process per engine, and a supervisor stopping them
def test_run_engines_ends_them_all_when_one_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each "worker" writes down how it was started; the one on GPU 1 then fails, the other waits.
    script = (
        "import json, os, sys, time; gpu = os.environ['RAGLINE_ENGINE_GPUS'];"
        f"open({str(tmp_path)!r} + '/' + gpu, 'w').write(json.dumps(dict(os.environ)));"
        "sys.exit(3) if gpu == '1' else time.sleep(60)"
    )

    def worker_command(kind: str, settings: Settings, **_: object) -> list[str]:
        return [sys.executable, "-c", script]

    monkeypatch.setattr(processes, "worker_command", worker_command)
    settings = Settings().replace(worker_metrics_port=9200)
    assert processes.run_engines(settings, [Placement((0,)), Placement((1,))]) == 3
    seen = {gpu: json.loads((tmp_path / gpu).read_text()) for gpu in ("0", "1")}
    assert seen["0"]["CUDA_VISIBLE_DEVICES"] == "0" and seen["1"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert {seen[g]["RAGLINE_WORKER_METRICS_PORT"] for g in seen} == {"9200", "9201"}
    assert seen["0"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
