"""What a wheel of ragline holds and installs: every package the checkout has, the server inside
``ragline`` (no top-level ``api``, ``broker``, ``workers``), and a client that installs light."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The checkout's folders a wheel installs, and the package each one becomes.
SOURCES = {
    "ragline": "ragline",
    "api": "ragline.api",
    "broker": "ragline.broker",
    "workers": "ragline.workers",
}
SERVER_TOP_LEVEL = ("api", "broker", "workers")
# What the client must not pull in: the heavy ones, and the server's own.
NOT_FOR_THE_CLIENT = (
    *("torch", "faiss", "transformers", "vllm"),
    *("fastapi", "celery", "redis", "pydantic_settings"),
)


def _checkout_packages() -> set[str]:
    found = set()
    for folder, package in SOURCES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    return found


def test_pyproject_lists_every_package_of_the_checkout() -> None:
    listed, found = set(PYPROJECT["tool"]["setuptools"]["packages"]), _checkout_packages()
    assert listed == found, (
        "pyproject.toml's [tool.setuptools] packages differs from the checkout's packages: "
        f"missing {sorted(found - listed)}, not in the checkout {sorted(listed - found)}"
    )


def test_the_base_dependencies_are_the_clients() -> None:
    project = PYPROJECT["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0] for dep in project["dependencies"]}
    assert names == {"httpx", "pydantic"}
    extras = project["optional-dependencies"]
    assert "client" in extras
    for host in ("cpu", "gpu"):
        assert "ragline[server]" in extras[host], f"the {host} extra must pull the server's dependencies"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout's sources (so that no build/ or egg-info lands in
    the checkout), with this environment's setuptools: no index needed."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", out, source], check=True, timeout=300)
    (built,) = out.glob("ragline-*.whl")
    return built


def test_the_wheel_installs_the_server_inside_ragline_with_its_data_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert not top & set(SERVER_TOP_LEVEL), f"top-level server packages in the wheel: {top}"
    assert {name for name in top if not name.endswith(".dist-info")} == {"ragline"}
    # The Lua scripts and the web page's files are package data: every one of them is in it.
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {".lua", ".html", ".js", ".css"}:
                inside = "/".join((*package.split("."), *path.relative_to(ROOT / folder).parts))
                assert inside in names, f"{path.relative_to(ROOT)} is not in the wheel"


def test_the_wheel_says_the_client_needs_httpx_and_pydantic_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(metadata).decode().splitlines()
    base = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    base = [req for req in base if "extra ==" not in req]
    assert sorted(req.split(">")[0] for req in base) == ["httpx", "pydantic"]
    assert "Provides-Extra: client" in lines and "Provides-Extra: server" in lines


_CLIENT_CHECK = """
import importlib.util, json, sys, sysconfig
from pathlib import Path
import ragline.client
from ragline.client import Client, QueryResponse
site = Path(sysconfig.get_paths()["purelib"])
print(json.dumps({
    "client": ragline.client.__file__,
    "installed": [m for m in %(heavy)r if importlib.util.find_spec(m) is not None],
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in %(heavy)r),
    "server_imported": sorted(
        m for m in sys.modules if m.startswith(("ragline.api", "ragline.broker", "ragline.workers"))
    ),
    "top_level": sorted(p.name for p in site.iterdir() if p.name in %(server)r),
}))
"""


@pytest.mark.slow
def test_ragline_client_installs_with_httpx_and_pydantic_only(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv, ``pip install "ragline-….whl[client]"`` from PyPI or pip's cache."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{wheel}[client]"],
        check=True,
        timeout=600,
        env=env,
    )
    # Run from tmp_path: the checkout's own ragline must not be the one imported.
    script = _CLIENT_CHECK % {"heavy": NOT_FOR_THE_CLIENT, "server": SERVER_TOP_LEVEL}
    out = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path, env=env
    )
    found = json.loads(out.stdout)
    assert found["client"].startswith(str(env_dir)), found["client"]
    assert found["installed"] == [], f"installed with the client: {found['installed']}"
    assert found["imported"] == [] and found["server_imported"] == [], found
    assert found["top_level"] == [], f"top-level server packages in site-packages: {found['top_level']}"
    # The command is the server's: it says what to install rather than a traceback.
    command = subprocess.run(
        [env_dir / "bin" / "ragline", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert command.returncode == 1 and 'pip install "ragline[cpu]"' in command.stderr, command.stderr
