"""The vLLM plugin: registered for vLLM to find, and on a CPU host its queues nap instead of spin."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from ragline.workers.generation import vllm_plugin


def test_vllm_finds_the_plugin() -> None:
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("ragline_cpu_idle") == "ragline.workers.generation.vllm_plugin:register"


@pytest.mark.slow  # imports vLLM
def test_on_a_cpu_host_the_queue_wait_naps(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the nap applies to CPU hosts only")
    monkeypatch.setattr(shm_broadcast, "sched_yield", shm_broadcast.sched_yield)  # restored after
    vllm_plugin.register()
    assert shm_broadcast.sched_yield is vllm_plugin._nap
