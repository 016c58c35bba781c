"""What an offline bundle holds: the target's interpreter and platform tags, what a ``pip freeze``
says the target already has, and the pruning of pip's resolved set to what ragline runs.

Pure logic, no pip and no network: ``ragline.bundle`` runs pip and hands its report here.
"""

from __future__ import annotations

import platform
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

EXTRAS = ("cpu", "gpu")
LEFT_OUT_FILE = "bundle_left_out.toml"

_PYTHON = re.compile(r"3\.\d{1,2}")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
# The legacy manylinux names, as the glibc they stand for (PEP 600).
_LEGACY = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
_LEGACY_ARCHES = {
    "manylinux2014": {"x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x"},
    "manylinux2010": {"x86_64", "i686"},
    "manylinux1": {"x86_64", "i686"},
}
_OLDEST_GLIBC_MINOR = 5


@dataclass(frozen=True, slots=True)
class Target:
    """The interpreter and platform a bundle is for."""

    python: str  # "3.12"
    platforms: tuple[str, ...]  # as pip's --platform takes them, every compatible tag
    extra: str  # "cpu" or "gpu"
    implementation: str = "cp"

    @property
    def machine(self) -> str:
        match = _MANYLINUX.fullmatch(self.platforms[0])
        return match.group(3) if match else platform.machine()


def parse_python(text: str) -> str:
    if not _PYTHON.fullmatch(text):
        raise ValueError(f"--python takes MAJOR.MINOR, such as 3.12, not {text!r}")
    return text


def host_python() -> str:
    return "{}.{}".format(*platform.python_version_tuple()[:2])


def host_platform() -> str:
    """This host's manylinux tag: the glibc it runs and its machine."""
    libc, version = platform.libc_ver()
    if libc != "glibc" or not version:
        raise ValueError("this host runs no glibc: name the target with --platform")
    major, minor = version.split(".")[:2]
    return f"manylinux_{major}_{minor}_{platform.machine()}"


def expand_platform(tag: str) -> list[str]:
    """Every tag a host of ``tag`` installs: pip's --platform matches a manylinux tag exactly,
    but a host with glibc 2.N installs the wheels built for any older glibc too."""
    match = _MANYLINUX.fullmatch(tag)
    if not match:
        if not re.fullmatch(r"[a-z0-9_]+", tag):
            raise ValueError(
                f"--platform takes a wheel platform tag such as manylinux_2_28_x86_64, not {tag!r}"
            )
        return [tag]
    major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
    if major != 2:
        return [tag]
    tags = []
    for glibc_minor in range(minor, _OLDEST_GLIBC_MINOR - 1, -1):
        tags.append(f"manylinux_2_{glibc_minor}_{arch}")
        legacy = _LEGACY.get((2, glibc_minor))
        if legacy and arch in _LEGACY_ARCHES[legacy]:
            tags.append(f"{legacy}_{arch}")
    return tags


def target_platforms(tags: Iterable[str]) -> tuple[str, ...]:
    expanded: dict[str, None] = {}
    for tag in tags:
        expanded.update(dict.fromkeys(expand_platform(tag)))
    return tuple(expanded)


@dataclass(frozen=True, slots=True)
class Installed:
    """A package the target already has; ``version`` None when pip froze it as a URL."""

    name: str
    version: str | None


def read_freeze(text: str) -> dict[str, Installed]:
    """The packages of a ``pip freeze``, by canonical name."""
    installed: dict[str, Installed] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):  # comments, -e and other options
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise ValueError(f"line {number} of the freeze: {raw!r}: {exc}") from None
        version = None
        if not req.url:
            pins = [s for s in req.specifier if s.operator in ("==", "===")]
            if len(pins) != 1 or "*" in pins[0].version:
                raise ValueError(f"line {number} of the freeze is no pin (name==version): {raw!r}")
            version = pins[0].version
        name = canonicalize_name(req.name)
        installed[name] = Installed(name, version)
    return installed


def public_version(version: str) -> str:
    """``2.11.0+cu130`` -> ``2.11.0``: the index's build of a version the target has with a local
    label (its own CUDA build) is the same release."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def freeze_constraints(installed: Mapping[str, Installed]) -> list[str]:
    """Constraints that make pip resolve to what the target has, so what is left out of the
    bundle is what the bundle's packages were resolved against."""
    return sorted(f"{p.name}=={public_version(p.version)}" for p in installed.values() if p.version)


# What a bundle must share with the target even when other versions conflict: vLLM's build is
# made for one torch, and a CUDA torch is the bulk of a GPU install.
ANCHORS = ("torch",)


def anchor_constraints(installed: Mapping[str, Installed]) -> list[str]:
    return freeze_constraints({name: p for name, p in installed.items() if name in ANCHORS})


def _active(req: Requirement, extras: Iterable[str], env: Mapping[str, str]) -> bool:
    """The requirement applies on the target, for a package asked for with ``extras``."""
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras))


def active_requirements(
    resolved: Mapping[str, Resolved], *, root: str, extra: str, env: Mapping[str, str]
) -> Iterator[Requirement]:
    """Every requirement that applies on the target, walking from ``root[extra]`` through
    pip's resolution with the extras each package is asked for."""
    extras_seen: dict[str, set[str]] = {}
    todo = [(canonicalize_name(root), {extra})]
    while todo:
        name, extras = todo.pop()
        seen = extras_seen.get(name)
        if (seen is not None and extras <= seen) or name not in resolved:
            continue
        extras_seen[name] = (seen or set()) | extras
        for line in resolved[name].requires:
            req = Requirement(line)
            if _active(req, extras, env):
                yield req
                todo.append((canonicalize_name(req.name), set(req.extras)))


def compatible_constraints(
    installed: Mapping[str, Installed], requirements: Iterable[Requirement], anchors: Iterable[str] = ()
) -> list[str]:
    """The target's versions that every one of ``requirements`` accepts, with the ``anchors``
    (constraints a resolution already succeeded on)."""
    specifiers: dict[str, list[SpecifierSet]] = {}
    for req in requirements:
        specifiers.setdefault(canonicalize_name(req.name), []).append(req.specifier)
    fitting = {}
    for name, package in installed.items():
        if package.version is None:
            continue
        try:
            version = Version(public_version(package.version))
        except InvalidVersion:
            continue
        if all(spec.contains(version, prereleases=True) for spec in specifiers.get(name, [])):
            fitting[name] = package
    return sorted(set(freeze_constraints(fitting)) | set(anchors))


def on_target(installed: Mapping[str, Installed], name: str, version: str) -> bool:
    """The target has this package at this version (its freeze named it by URL: any version)."""
    have = installed.get(name)
    return have is not None and (
        have.version is None or public_version(have.version) == public_version(version)
    )


def _left_out_table() -> dict:
    return tomllib.loads(resources.files("ragline").joinpath(LEFT_OUT_FILE).read_text())


def left_out_list(extra: str) -> dict[str, str]:
    """The dependencies a bundle for ``extra`` leaves out, each with why (bundle_left_out.toml)."""
    table = _left_out_table().get(extra, {})
    return {canonicalize_name(name): entry["why"] for name, entry in table.items()}


def unmeasured_vllm(resolved: Mapping[str, Resolved]) -> str | None:
    """The vLLM version a gpu bundle resolved, where the gpu list was measured on another."""
    measured = _left_out_table()["measured"]["vllm"]
    vllm = resolved.get("vllm")
    return vllm.version if vllm and vllm.version != measured else None


@dataclass(frozen=True, slots=True)
class Resolved:
    """One package of pip's resolution (``pip install --dry-run --report``)."""

    name: str  # canonical
    version: str
    url: str
    requires: tuple[str, ...] = ()

    @classmethod
    def from_report(cls, item: Mapping[str, object]) -> Resolved:
        metadata = item["metadata"]
        download = item["download_info"]
        assert isinstance(metadata, Mapping) and isinstance(download, Mapping)
        return cls(
            name=canonicalize_name(str(metadata["name"])),
            version=str(metadata["version"]),
            url=str(download["url"]),
            requires=tuple(metadata.get("requires_dist", ())),
        )


@dataclass(frozen=True, slots=True)
class LeftOut:
    name: str
    version: str
    why: str


@dataclass(slots=True)
class Plan:
    bundle: list[Resolved] = field(default_factory=list)  # to download
    on_target: list[Installed] = field(default_factory=list)  # needed, and the target has it
    left_out: list[LeftOut] = field(default_factory=list)  # resolved, and not carried


def marker_environment(target: Target, reported: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment markers are evaluated in: what pip reported for the target interpreter
    (ragline.bundle runs pip on one), with the target's machine."""
    env = {k: str(v) for k, v in (reported or default_environment()).items()}
    env["platform_machine"] = target.machine
    return env


def plan_bundle(
    resolved: Mapping[str, Resolved],
    *,
    root: str,
    extra: str,
    env: Mapping[str, str],
    left_out: Mapping[str, str],
    installed: Mapping[str, Installed],
) -> Plan:
    """Walk the requirements from ``root[extra]`` through pip's resolution: a package the target
    has, or that ``left_out`` names, ends its branch; what stays unreached was needed only by
    those left out."""
    plan = Plan()
    extras_seen: dict[str, set[str]] = {}
    reached: list[str] = []
    todo = [(canonicalize_name(root), {extra})]
    noted: set[str] = set()
    while todo:
        name, extras = todo.pop()
        seen = extras_seen.get(name)
        if seen is not None and extras <= seen:
            continue
        if seen is None:
            reached.append(name)
        extras_seen[name] = (seen or set()) | extras
        package = resolved.get(name)
        if package is None:
            raise ValueError(f"{name} is required but pip did not resolve it for this target")
        for line in package.requires:
            req = Requirement(line)
            if not _active(req, extras, env):
                continue
            dep = canonicalize_name(req.name)
            if dep in resolved and on_target(installed, dep, resolved[dep].version):
                if dep not in noted:
                    plan.on_target.append(installed[dep])
                    noted.add(dep)
            elif dep in left_out:
                if dep not in noted:
                    version = resolved[dep].version if dep in resolved else "-"
                    plan.left_out.append(LeftOut(dep, version, left_out[dep]))
                    noted.add(dep)
            else:
                todo.append((dep, set(req.extras)))
    plan.bundle = [resolved[name] for name in reached]
    needed_by: dict[str, list[str]] = {}
    for package in resolved.values():
        for line in package.requires:
            needed_by.setdefault(canonicalize_name(Requirement(line).name), []).append(package.name)
    for unreached in sorted(set(resolved) - set(reached) - noted):
        if on_target(installed, unreached, resolved[unreached].version):
            plan.on_target.append(installed[unreached])
            continue
        parents = sorted(set(needed_by.get(unreached, [])) - set(reached) - {unreached})
        whose = ", ".join(
            f"{p} ({'on the target' if on_target(installed, p, resolved[p].version) else 'left out'})"
            for p in parents
        )
        why = f"needed only by {whose}" if whose else "needed by nothing this bundle carries"
        plan.left_out.append(LeftOut(unreached, resolved[unreached].version, why))
    plan.bundle.sort(key=lambda p: p.name)
    plan.on_target.sort(key=lambda p: p.name)
    return plan
