"""What the generation worker asks of an engine: vLLM's (``engine.py``) or transformers'
(``hf_engine.py``), built with the worker's GenerationSettings and the model's path.

Both declare it as a base, so a type checker holds each to it; ``tests/workers/generation/
test_engine_protocol.py`` checks the same at run time.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # engine.py declares Engine as its base: no import back at run time
    from ragline.workers.generation.engine import Delta


@runtime_checkable
class Engine(Protocol):
    def start(self) -> None:
        """Load the model; once it returns, :meth:`stream` generates."""
        ...

    def prefix_block_tokens(self) -> int:
        """The tokens of one KV block the engine's prefix cache reuses (1: it reuses none): the
        prompt's fixed head is padded to whole blocks of it."""
        ...

    def stream(
        self,
        request_id: str,
        prompt: Sequence[int] | str,
        *,
        max_tokens: int,
        timeout_s: float,
        temperature: float | None = None,
        stop: tuple[str, ...] = (),
    ) -> Generator[Delta, None, None]:
        """Generate from a worker thread, the answer's text as deltas, the last one ``finished``
        (``prompt``: token ids, as the prompt builder makes them, or a trusted text);
        ``temperature`` None is the setting's, and the answer ends before any of ``stop``.
        Raises EngineUnavailable when the engine is not running (its task is requeued) and
        GenerationTimeout past ``timeout_s``; closing the generator aborts the request."""
        ...

    def shutdown(self) -> None:
        """Stop generating and free the engine (its processes, its threads)."""
        ...
