"""Where the encoder runs: a GPU only where torch can use it, else the CPU."""

from __future__ import annotations

import pytest


def test_a_gpu_torch_cannot_use_falls_back_to_the_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch
    from ragline.workers.retrieval.embedder import usable_device

    assert usable_device("cpu") == usable_device("") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only torch
    assert usable_device("cuda:0") == "cpu"
    assert "not one torch can use" in caplog.text
    # A CUDA torch with two GPUs visible (a narrow fake: no GPU here).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert (usable_device("cuda"), usable_device("cuda:1")) == ("cuda", "cuda:1")
    assert usable_device("cuda:2") == usable_device("cuda:x") == usable_device("mps") == "cpu"
