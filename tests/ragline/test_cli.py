"""The ``ragline`` command on real parts: ingest refuses index names that leave the index root,
and ``ragline webhooks secret set`` gives a key its own webhook secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.settings import Settings
from tests.conftest import env_for

pytestmark = pytest.mark.integration


def _ragline(settings: Settings, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragline", *args],
        env=env_for(settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("name", ["..", ".", "../elsewhere", "a/b", "/abs", "x" * 65, "bad name", "tab\n"])
def test_ingest_refuses_a_name_outside_the_index_root(
    settings: Settings, corpus: Path, tmp_path: Path, name: str
) -> None:
    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    # Folders beside the index root that a prune of old "versions" would take first (they sort
    # before a version's timestamp).
    for sibling in ("elsewhere/0001-precious", "elsewhere/0002-precious", "0001-precious"):
        (home / sibling).mkdir(parents=True)
        (home / sibling / "keep.txt").write_text("mine")
    before = _tree(home)
    done = _ragline(settings.model_copy(update={"home": home}), "ingest", str(corpus), "--index", name)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "index name" in done.stderr and "letters, digits" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert _tree(home) == before


def test_ingest_refuses_a_bad_default_index(settings: Settings, corpus: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = settings.model_copy(update={"home": home, "default_index": "../x"})
    done = _ragline(bad, "ingest", str(corpus))
    assert done.returncode == 2 and "'../x'" in done.stderr, done.stderr
    assert list(home.iterdir()) == []
