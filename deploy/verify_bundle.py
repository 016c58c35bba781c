"""Check an offline bundle (``ragline bundle``) before deploy/install.sh installs it, and what the
target must already have after. Standard library only: it runs before ragline is installed.

    verify_bundle.py DIR --wheel-list FILE   every file's size and sha256 as the manifest says, no
                                             wheel it does not list, this Python the target's;
                                             prints "EXTRA SYSTEM_SITE" (e.g. "gpu 1") and writes
                                             the wheels to install, one path a line, to FILE
    verify_bundle.py DIR --on-target         run by the new environment's Python: the packages
                                             the bundle left to the target are there, at the
                                             versions it was resolved against

Exits 1 with the reason on the first thing wrong. The manifest is ragline/bundle_manifest.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import sys
from pathlib import Path

FORMAT = 1
EXTRAS = ("cpu", "gpu")


class BundleInvalid(Exception):
    pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load(bundle: Path) -> dict:
    try:
        manifest = json.loads((bundle / "manifest.json").read_text())
    except FileNotFoundError:
        raise BundleInvalid(f"{bundle} has no manifest.json: not a bundle from `ragline bundle`") from None
    except json.JSONDecodeError as exc:
        raise BundleInvalid(f"{bundle}/manifest.json is not JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise BundleInvalid(f"manifest format {manifest.get('format')!r}; this script reads {FORMAT}")
    if manifest["target"]["extra"] not in EXTRAS:
        raise BundleInvalid(f"unknown extra {manifest['target']['extra']!r}")
    return manifest


def verify(bundle: Path, manifest: dict) -> list[Path]:
    """The wheels to install, once every listed file is intact and nothing else lies beside them."""
    root = bundle.resolve()
    listed: set[Path] = set()
    wheels = []
    for entry in manifest["files"]:
        path = (root / entry["file"]).resolve()
        if root not in path.parents:
            raise BundleInvalid(f"the manifest names a file outside the bundle: {entry['file']!r}")
        if not path.is_file():
            raise BundleInvalid(f"missing: {entry['file']}")
        if path.stat().st_size != entry["size"]:
            raise BundleInvalid(
                f"{entry['file']}: {path.stat().st_size} bytes, the manifest says {entry['size']}"
            )
        if _sha256(path) != entry["sha256"]:
            raise BundleInvalid(f"{entry['file']}: its sha256 is not the manifest's (damaged or replaced)")
        listed.add(path)
        if entry["role"] == "install":
            wheels.append(path)
    # pip installs whatever wheel lies in a --find-links folder: an unlisted one is refused.
    stray = sorted(
        p.name for p in [*root.glob("*.whl"), *root.glob("models/*.whl")] if p.resolve() not in listed
    )
    if stray:
        raise BundleInvalid(f"wheels the manifest does not list: {', '.join(stray)}")
    python = "{}.{}".format(*sys.version_info[:2])
    if manifest["target"]["python"] != python:
        raise BundleInvalid(
            f"the bundle is for Python {manifest['target']['python']}, this is {python} ({sys.executable}): "
            "set PYTHON to the target's interpreter"
        )
    return wheels


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def check_on_target(manifest: dict) -> None:
    missing = []
    for package in manifest.get("on_target", []):
        try:
            have = md.version(package["name"])
        except md.PackageNotFoundError:
            missing.append(f"{package['name']} (not installed)")
            continue
        want = package["version"]
        if want and _public(have) != _public(want):
            missing.append(f"{package['name']} {have} (the bundle was resolved against {want})")
    if missing:
        raise BundleInvalid(
            "the bundle relies on the target having these, in this environment (created with "
            "--system-site-packages): " + "; ".join(missing)
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--wheel-list", type=Path, help="write the wheels to install here")
    mode.add_argument("--on-target", action="store_true", help="check what the target must have")
    args = parser.parse_args(argv)
    try:
        manifest = load(args.bundle)
        if args.on_target:
            check_on_target(manifest)
            return 0
        wheels = verify(args.bundle, manifest)
    except BundleInvalid as exc:
        print(f"verify_bundle: {args.bundle}: {exc}", file=sys.stderr)
        return 1
    args.wheel_list.write_text("".join(f"{w}\n" for w in wheels))
    system_site = 1 if manifest.get("on_target") else 0
    print(f"{manifest['target']['extra']} {system_site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
