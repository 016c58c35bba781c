"""A vLLM general plugin (vLLM loads it in each of its processes): on a CPU host, the queues
between vLLM's processes are polled with short sleeps instead of a spin.

vLLM's engine core and its model worker hand each other work through shared-memory queues whose
readers spin (``sched_yield``) for a second after each message before they sleep on a socket.
On a GPU host that spin has a core of its own and saves microseconds per step. On a CPU host it
runs on the very cores the model computes on: the engine core spins through every step while the
worker computes it, and the worker spins for a second after each step. Anything else on those
cores waits for the spin: a one-query retrieval encode beside an idle engine took many times its
own time (docs/performance.md).

Here each turn of that loop sleeps ``POLL_S`` instead of yielding: the queue is still polled
(vLLM's wake-up logic is untouched), at a cost of at most ``POLL_S`` per hand-over, small beside
a model step on a CPU. (Waiting on the writer's notify socket instead, with no spin, hung the
engine: that socket may drop a wake-up, which the spin never relied on.)

Registered in pyproject.toml under ``vllm.general_plugins``; vLLM's ``VLLM_PLUGINS`` can leave
it out.
"""

from __future__ import annotations

import time

POLL_S = 0.0005


def _nap() -> None:
    time.sleep(POLL_S)


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.distributed.device_communicators import shm_broadcast

    shm_broadcast.sched_yield = _nap
