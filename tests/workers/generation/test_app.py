"""The generation worker's start: one that cannot build its engine exits before it consumes."""

from __future__ import annotations

from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings

from tests.helpers import worker


@pytest.mark.integration
def test_a_generation_worker_without_its_model_exits_instead_of_consuming(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "generation.log"
    proc = worker("generation", settings.replace(generation_model=str(tmp_path / "no-model")), log)
    proc.start()
    try:
        assert proc.proc is not None
        assert proc.proc.wait(180) == 1, proc.tail()
    finally:
        proc.stop()
    assert "the generation engine did not start" in log.read_text()
    assert "ready." not in log.read_text()  # Celery's line once it consumes
