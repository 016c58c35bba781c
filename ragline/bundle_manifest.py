"""The manifest of an offline bundle (``manifest.json``): what it is for, every file with its hash,
what it relies on the target having, and what it leaves out and why.

deploy/verify_bundle.py reads the same file on the target with the standard library alone
(ragline is not installed yet there): a change of its fields changes that script too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

MANIFEST = "manifest.json"
MODELS_DIR = "models"  # beside the wheels, so pip's --find-links on the bundle never sees them
FORMAT: Final = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BundleTarget(_Frozen):
    python: str
    platforms: tuple[str, ...]
    implementation: str
    extra: Literal["cpu", "gpu"]


class BundleFile(_Frozen):
    file: str  # relative to the bundle
    name: str
    version: str
    sha256: str
    size: int
    # "install": a wheel deploy/install.sh installs; "model": read by `ragline models prepare --from`.
    role: Literal["install", "model"]


class OnTarget(_Frozen):
    name: str
    version: str | None  # None: the target's freeze named it by URL


class LeftOutPackage(_Frozen):
    name: str
    version: str
    why: str


class Manifest(_Frozen):
    format: Literal[1] = FORMAT
    ragline_version: str
    created_at: str  # UTC, ISO 8601
    target: BundleTarget
    files: tuple[BundleFile, ...]
    on_target: tuple[OnTarget, ...] = ()
    left_out: tuple[LeftOutPackage, ...] = ()

    def install_files(self) -> list[BundleFile]:
        return [f for f in self.files if f.role == "install"]

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


Role = Literal["install", "model"]


def describe(bundle: Path, relative: str, *, name: str, version: str, role: Role) -> BundleFile:
    path = bundle / relative
    return BundleFile(
        file=relative,
        name=name,
        version=version,
        sha256=sha256_of(path),
        size=path.stat().st_size,
        role=role,
    )


def write(bundle: Path, manifest: Manifest) -> Path:
    path = bundle / MANIFEST
    path.write_text(manifest.model_dump_json(indent=2) + "\n")
    return path


def read(bundle: Path) -> Manifest:
    return Manifest.model_validate_json((bundle / MANIFEST).read_text())
