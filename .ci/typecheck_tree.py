"""Lay the package out as installed, for mypy and import-linter: build/typecheck/ragline/.

The server's packages live in the repository's top-level folders (api/, broker/, workers/) and are
imported as ragline.api, ragline.broker and ragline.workers: pyproject's
[tool.setuptools.package-dir] maps them for the wheel, and ragline/__init__.py extends its path
for a checkout. Neither tool follows either, so this builds the installed tree from symlinks into
the checkout (mypy and import-linter then read the files themselves) and prints its root, which
goes on MYPYPATH and is import-linter's working directory. Run from anywhere; idempotent.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "build" / "typecheck"


def build() -> Path:
    mapping: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    if ROOT.exists():
        shutil.rmtree(ROOT)
    for package, folder in sorted(mapping.items()):  # "ragline" before "ragline.api"
        target = ROOT.joinpath(*package.split("."))
        source = REPO / folder
        if package == "ragline":
            # Its own files one by one: the folder also receives the mapped subpackages.
            target.mkdir(parents=True)
            for entry in sorted(source.iterdir()):
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source, target_is_directory=True)
    return ROOT


if __name__ == "__main__":
    sys.stdout.write(f"{build()}\n")
