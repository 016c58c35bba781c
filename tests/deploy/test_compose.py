"""Offline checks of the container deployment: docker-compose.yml and deploy/docker/Dockerfile.

`docker-compose config` validates the file against the compose schema without a Docker engine.
CI installs docker-compose; a missing binary is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"

EXPECTED_SERVICES = {
    "redis",
    "api",
    "retrieval-worker",
    "ingest-worker",
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


# What an operator puts in .env; the file has no defaults for them.
SECRETS = {
    "RAGLINE_REDIS_PASSWORD": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "RAGLINE_WEBHOOK_SECRET": "test-webhook-secret-for-compose",
    "RAGLINE_FLOWER_PASSWORD": "test-flower-password",
}


def _compose_env(**secrets: str) -> dict[str, str]:
    # Only the file on disk decides: no COMPOSE_* or secrets from the caller's shell.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_") and k not in SECRETS}
    return {**env, **secrets}


def _config(*profiles: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [_docker_compose()]
    for profile in profiles:
        cmd += ["--profile", profile]
    cmd += ["-f", "docker-compose.yml", "config"]
    env = _compose_env(**SECRETS) if env is None else env
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def resolved() -> dict:
    """The file as compose resolves it, every profile on, the secrets set."""
    done = _config("setup", "ingest", "gpu")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.fixture(scope="module")
def compose() -> dict:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.mark.slow  # runs docker-compose
@pytest.mark.parametrize(
    "profiles",
    [(), ("gpu",), ("setup",), ("ha",), ("setup", "ingest", "gpu")],
    ids=lambda p: "+".join(p) or "default",
)
def test_compose_config_validates(profiles: tuple[str, ...]) -> None:
    proc = _config(*profiles)
    assert proc.returncode == 0, f"compose config failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.slow  # runs docker-compose
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(missing: str) -> None:
    """No placeholder to fall back to: without the secret, compose stops and names it."""
    proc = _config(env=_compose_env(**{k: v for k, v in SECRETS.items() if k != missing}))
    assert proc.returncode != 0
    assert f"set {missing}" in proc.stderr, proc.stderr


def _published(port: object) -> tuple[str, int]:
    """(host interface, host port) of one `ports` entry as `compose config` prints it."""
    if isinstance(port, dict):
        return str(port.get("host_ip", "0.0.0.0")), int(port["published"])
    parts = str(port).split("/")[0].split(":")
    return (parts[0] if len(parts) == 3 else "0.0.0.0"), int(parts[-2] if len(parts) > 1 else parts[0])


@pytest.mark.slow  # runs docker-compose
def test_only_the_api_is_published_on_every_interface(resolved: dict) -> None:
    published = {
        name: [_published(p) for p in service.get("ports", [])]
        for name, service in resolved["services"].items()
    }
    assert published.pop("api") == [("0.0.0.0", 8000)]
    assert published.pop("flower") == [("127.0.0.1", 5555)]
    assert all(ports == [] for ports in published.values()), published
    assert "expose" not in resolved["services"]["redis"]


@pytest.mark.slow  # runs docker-compose
def test_every_process_logs_in_to_redis_with_its_password(resolved: dict) -> None:
    password = SECRETS["RAGLINE_REDIS_PASSWORD"]
    for name, service in resolved["services"].items():
        if name != "redis" and not name.startswith(REDIS_HA_SERVICES):
            assert (
                service["environment"]["RAGLINE_REDIS_URL"] == f"redis://ragline:{password}@redis:6379/0"
            ), name
    redis = resolved["services"]["redis"]
    assert redis["environment"]["REDISCLI_AUTH"] == password
    assert "redis-cli --user ragline ping | grep -q PONG" in redis["healthcheck"]["test"][1]


@pytest.mark.slow  # runs docker-compose
def test_secrets_reach_the_processes_that_check_them(resolved: dict) -> None:
    services = resolved["services"]
    for name in ("api", "callbacks-worker"):
        assert services[name]["environment"]["RAGLINE_WEBHOOK_SECRET"] == SECRETS["RAGLINE_WEBHOOK_SECRET"]
    assert services["flower"]["environment"]["RAGLINE_FLOWER_PASSWORD"] == SECRETS["RAGLINE_FLOWER_PASSWORD"]


@pytest.mark.redis  # a redis-server of its own
@pytest.mark.slow  # runs docker-compose
def test_redis_as_compose_runs_it_refuses_anonymous_clients(resolved: dict, tmp_path: Path) -> None:
    """The redis service's own command line on a real redis-server: no client gets in without
    the password, ragline's URL does, and the healthcheck's redis-cli passes."""
    redis_server = shutil.which("redis-server")
    assert redis_server, "redis-server is needed (Debian: apt-get install -y redis-server)"
    service = resolved["services"]["redis"]
    command = service["command"]
    assert command[0] == "redis-server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [redis_server, *command[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = resolved["services"]["api"]["environment"]["RAGLINE_REDIS_URL"]
        url = url.replace("@redis:6379", f"@127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while True:
            try:
                assert redis.Redis.from_url(url, socket_timeout=2).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        anonymous = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.hset("ragline:apikeys", "digest", "{}")
        wrong = redis.Redis.from_url(
            url.replace(SECRETS["RAGLINE_REDIS_PASSWORD"], "guess"), socket_timeout=2
        )
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
        kind, line = service["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        probe = ["sh", "-c", line.replace("redis-cli", f"redis-cli -p {port}", 1)]
        env = {**os.environ, **service["environment"]}
        assert subprocess.run(probe, env=env, timeout=10, check=False).returncode == 0
        unauthenticated = {k: v for k, v in env.items() if k != "REDISCLI_AUTH"}
        assert subprocess.run(probe, env=unauthenticated, timeout=10, check=False).returncode != 0
    finally:
        server.terminate()
        server.wait(10)


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
        # redis:// unless the `ha` profile's .env names the sentinels instead.
        scheme = "${RAGLINE_REDIS_SCHEME:-redis}://ragline:${RAGLINE_REDIS_PASSWORD:?"
        assert env["RAGLINE_REDIS_URL"].startswith(scheme), name
        assert str(env["HF_HUB_OFFLINE"]) == "1", name


def test_workers_share_data_volume_and_stop_cleanly(compose: dict) -> None:
    services = compose["services"]
    assert "ragline-data" in compose["volumes"]
    for name in (
        "retrieval-worker",
        "ingest-worker",
        "api",
        "generation-worker",
        "generation-worker-gpu",
        "models",
    ):
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


@pytest.mark.slow  # runs docker-compose
def test_cores_from_ragline_cores_reach_each_container() -> None:
    """What `ragline cores` prints for this host, put in the environment (as in .env), becomes the
    engine's cpuset and everything else's; unset, no container is confined."""
    printed = subprocess.run(
        [sys.executable, "-m", "ragline", "cores"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    split = dict(line.split("=", 1) for line in printed.splitlines() if not line.startswith("#"))
    assert set(split) == {"RAGLINE_ENGINE_CPUS", "RAGLINE_SERVING_CPUS"}, printed
    for env, engine, serving in (
        ({"RAGLINE_ENGINE_CPUS": "2-7", "RAGLINE_SERVING_CPUS": "0-1"}, "2-7", "0-1"),
        (split, split["RAGLINE_ENGINE_CPUS"], split["RAGLINE_SERVING_CPUS"]),
        ({}, "", ""),
    ):
        base = {k: v for k, v in _compose_env(**SECRETS).items() if k not in split}
        done = _config("setup", "ingest", "gpu", env={**base, **env})
        assert done.returncode == 0, done.stderr
        services = yaml.safe_load(done.stdout)["services"]
        for name in ("redis", "api", "retrieval-worker", "ingest-worker", "callbacks-worker", "flower"):
            assert services[name].get("cpuset", "") == serving, name
        assert services["generation-worker"].get("cpuset", "") == engine


def test_flower_basic_auth_and_sigint(compose: dict) -> None:
    flower = compose["services"]["flower"]
    # `ragline flower`: it refuses a guessable password, and passes it in the environment.
    assert flower["command"] == ["ragline", "flower"]
    env = flower["environment"]
    assert env["RAGLINE_FLOWER_PORT"] == "5555" and env["RAGLINE_FLOWER_ADDRESS"] == "0.0.0.0"
    assert "RAGLINE_FLOWER_USER" in env
    assert env["RAGLINE_FLOWER_PASSWORD"].startswith("${RAGLINE_FLOWER_PASSWORD:?"), "no default password"
    assert flower["stop_signal"] == "SIGINT"


def test_models_is_a_setup_one_shot(compose: dict) -> None:
    models = compose["services"]["models"]
    assert models["command"] == ["ragline", "models", "prepare"]
    assert models["profiles"] == ["setup"]


def test_gpu_worker_requests_nvidia_devices(compose: dict) -> None:
    gpu = compose["services"]["generation-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["args"]["EXTRA"] == "gpu"
    # One engine per GPU of the container's (its placement: ragline/placement.py).
    assert gpu["command"][:5] == ["ragline", "worker", "generation", "--gpus", "${RAGLINE_GPUS:-all}"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", [])
        for d in devices
    ), devices
    # The CPU-only vLLM knobs have no place on the GPU worker, and the device chooses the rest.
    env = gpu["environment"]
    assert not any(k.startswith("VLLM_CPU_") for k in env)
    for name in (
        "RAGLINE_DTYPE",
        "RAGLINE_MAX_NUM_SEQS",
        "RAGLINE_GPU_MEMORY_UTILIZATION",
        "RAGLINE_KV_BLOCK_SIZE",
    ):
        assert name not in env, name


@pytest.mark.slow  # runs docker-compose
def test_gpus_and_tensor_parallel_reach_the_gpu_worker() -> None:
    for env, gpus, tp in (
        ({}, "all", "1"),
        ({"RAGLINE_GPUS": "0,2", "RAGLINE_TENSOR_PARALLEL": "2"}, "0,2", "2"),
    ):
        done = _config("gpu", env={**_compose_env(**SECRETS), **env})
        assert done.returncode == 0, done.stderr
        service = yaml.safe_load(done.stdout)["services"]["generation-worker-gpu"]
        assert service["command"] == ["ragline", "worker", "generation", "--gpus", gpus]
        assert service["environment"]["RAGLINE_TENSOR_PARALLEL"] == tp


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "FROM python:3.11-slim-bookworm" in text
    assert "ARG EXTRA=cpu" in text
    assert "libtcmalloc-minimal4" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec triton" in text
    user_lines = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert user_lines and user_lines[-1] not in {"root", "0"}, "the image must run as non-root"
    assert 'CMD ["ragline", "api"]' in text


REDIS_HA_SERVICES = ("redis-replica-", "sentinel-")  # the `ha` profile's Redis nodes and sentinels
# What .env says with the `ha` profile (the top of docker-compose.yml).
HA_ENV = {
    "RAGLINE_REDIS_SCHEME": "redis+sentinel",
    "RAGLINE_REDIS_ADDRESS": "sentinel-a:26379,sentinel-b:26379,sentinel-c:26379/ragline/0",
}


@pytest.mark.slow  # runs docker-compose
def test_the_ha_profile_is_a_primary_two_replicas_and_three_sentinels(tmp_path: Path) -> None:
    from ragline.broker.config.settings import RedisSettings
    from ragline.broker.redis.target import parse

    done = _config("ha", env=_compose_env(**SECRETS, **HA_ENV))
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    password = SECRETS["RAGLINE_REDIS_PASSWORD"]
    ragline = {n: s for n, s in services.items() if "RAGLINE_REDIS_URL" in s.get("environment", {})}
    assert {"api", "retrieval-worker", "generation-worker", "callbacks-worker", "flower"} <= set(ragline)
    for name, service in ragline.items():
        env = service["environment"]
        target = parse(env["RAGLINE_REDIS_URL"], sentinel_password=env["RAGLINE_REDIS_SENTINEL_PASSWORD"])
        assert target.sentinels == (("sentinel-a", 26379), ("sentinel-b", 26379), ("sentinel-c", 26379)), name
        assert (target.master, target.username, target.password, target.sentinel_password) == (
            "ragline", "ragline", password, password,
        )  # fmt: skip
        assert RedisSettings(redis_url=env["RAGLINE_REDIS_URL"]).wait_replicas == 1  # jobs wait for a replica
    for name in ("redis-replica-a", "redis-replica-b"):
        command = " ".join(services[name]["command"])
        assert "--appendonly yes" in command and "--replicaof redis 6379" in command
        assert f"--masterauth {password}" in command and f"--replica-announce-ip {name}" in command
        assert "--user default off" in command and not services[name].get("ports")
    assert f"--masterauth {password}" in " ".join(services["redis"]["command"])  # once demoted
    for name in ("sentinel-a", "sentinel-b", "sentinel-c"):
        service = services[name]
        assert not service.get("ports")
        # The service's own script, run with its environment, but printing the config it writes.
        script = service["command"][2].replace("/tmp/sentinel.conf", str(tmp_path / f"{name}.conf"))
        script = script.replace("exec redis-sentinel", "cat").replace("$$", "$")  # compose unescapes it
        env = {**os.environ, **service["environment"]}
        config = subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert f"sentinel announce-ip {name}" in config
        assert "sentinel monitor ragline redis 6379 2" in config  # a quorum of two of three
        assert f"requirepass {password}" in config and f"sentinel auth-pass ragline {password}" in config
