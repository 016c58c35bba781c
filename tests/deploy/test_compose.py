"""Offline checks of the container deployment: docker-compose.yml and deploy/docker/Dockerfile.

`docker-compose config` validates the file against the compose schema without a Docker engine.
CI installs docker-compose; a missing binary is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"

EXPECTED_SERVICES = {
    "redis",
    "api",
    "retrieval-worker",
    "generation-worker",
    "generation-worker-gpu",
    "flower",
    "models",
}


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not on PATH; it is needed to validate docker-compose.yml offline "
            "(Debian/Ubuntu: `apt-get install -y docker-compose`)",
            pytrace=False,
        )
    return exe


def _compose_env() -> dict[str, str]:
    # Only the file on disk decides: no COMPOSE_* from the caller's shell.
    return {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}


@pytest.fixture(scope="module")
def compose() -> dict:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize(
    "profiles",
    [(), ("gpu",), ("setup",), ("setup", "ingest", "gpu")],
    ids=lambda p: "+".join(p) or "default",
)
def test_compose_config_validates(profiles: tuple[str, ...]) -> None:
    exe = _docker_compose()
    cmd = [exe]
    for profile in profiles:
        cmd += ["--profile", profile]
    cmd += ["-f", "docker-compose.yml", "config", "-q"]
    proc = subprocess.run(
        cmd, cwd=REPO, env=_compose_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def test_no_version_key(compose: dict) -> None:
    assert "version" not in compose, "compose spec files carry no top-level `version:`"


def test_services_present(compose: dict) -> None:
    missing = EXPECTED_SERVICES - set(compose["services"])
    assert not missing, f"services missing from docker-compose.yml: {sorted(missing)}"


def test_redis_persists_and_is_health_checked(compose: dict) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    command = " ".join(command) if isinstance(command, list) else command
    assert "--appendonly yes" in command
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert "ping" in " ".join(redis["healthcheck"]["test"])


def test_api(compose: dict) -> None:
    api = compose["services"]["api"]
    assert api["command"] == ["ragline", "api"]
    assert api["environment"]["RAGLINE_API_HOST"] == "0.0.0.0"
    assert any(str(p).endswith("8000:8000") for p in api["ports"])
    assert "/healthz" in " ".join(api["healthcheck"]["test"])
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert api["build"]["dockerfile"] == "deploy/docker/Dockerfile"


def test_common_environment(compose: dict) -> None:
    for name in EXPECTED_SERVICES - {"redis"}:
        env = compose["services"][name]["environment"]
        assert env["RAGLINE_REDIS_URL"] == "redis://redis:6379/0", name
        assert str(env["HF_HUB_OFFLINE"]) == "1", name


def test_workers_share_data_volume_and_stop_cleanly(compose: dict) -> None:
    services = compose["services"]
    assert "ragline-data" in compose["volumes"]
    for name in ("retrieval-worker", "generation-worker", "generation-worker-gpu", "models"):
        assert "ragline-data:/data" in services[name]["volumes"], name
        assert services[name]["environment"]["RAGLINE_HOME"] == "/data", name
    for name in ("retrieval-worker", "generation-worker", "generation-worker-gpu"):
        assert services[name]["stop_signal"] == "SIGTERM", name
    assert services["generation-worker"]["stop_grace_period"] == "60s"
    assert services["generation-worker-gpu"]["stop_grace_period"] == "60s"


def test_generation_worker_sizes_itself(compose: dict) -> None:
    env = compose["services"]["generation-worker"]["environment"]
    # No core list, KV size, dtype or batch size from one development box: the container
    # chooses them from what it may use.
    for name in (
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "RAGLINE_DTYPE",
        "RAGLINE_MAX_NUM_SEQS",
    ):
        assert name not in env, name


def test_flower_basic_auth_and_sigint(compose: dict) -> None:
    flower = compose["services"]["flower"]
    command = flower["command"]
    command = " ".join(command) if isinstance(command, list) else command
    assert "celery -A broker.celery_app:app flower" in command
    assert "--port=5555" in command
    assert "--basic-auth=" in command
    env = flower["environment"]
    assert "RAGLINE_FLOWER_USER" in env
    assert "RAGLINE_FLOWER_PASSWORD" in env
    assert flower["stop_signal"] == "SIGINT"


def test_models_is_a_setup_one_shot(compose: dict) -> None:
    models = compose["services"]["models"]
    assert models["command"] == ["ragline", "models", "prepare"]
    assert models["profiles"] == ["setup"]


def test_gpu_worker_requests_nvidia_device(compose: dict) -> None:
    gpu = compose["services"]["generation-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["args"]["EXTRA"] == "gpu"
    assert gpu["command"] == ["ragline", "worker", "generation"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and d.get("count") == 1 and "gpu" in d.get("capabilities", [])
        for d in devices
    ), devices
    # The CPU-only vLLM knobs have no place on the GPU worker.
    assert not any(k.startswith("VLLM_CPU_") for k in gpu["environment"])


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "FROM python:3.11-slim-bookworm" in text
    assert "ARG EXTRA=cpu" in text
    assert "libtcmalloc-minimal4" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec triton" in text
    user_lines = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert user_lines and user_lines[-1] not in {"root", "0"}, "the image must run as non-root"
    assert 'CMD ["ragline", "api"]' in text
