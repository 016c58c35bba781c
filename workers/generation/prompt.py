"""RAG prompts built for vLLM's prefix cache: a fixed system prefix, then sources in a stable order.

The engine reuses cached KV state only in whole blocks (128 tokens on the CPU backend), so the
system prefix alone, shorter than a block, is recomputed every time; what is reused is a repeated
set of sources, which is why they are rendered in a stable order before the question. Prefill
time grows with the prompt, so the sources get a token budget of their own
(``max_source_tokens``): past it the lowest-scored are dropped, and the answer reports how many.

A conversation's earlier turns (the chat endpoint's) go between the system prefix and the
sources, as the chat template's own turns, with a token budget of their own
(``max_history_tokens``); a prompt over a budget drops the oldest turns first, and only then
sources: the sources ground the answer, an old turn rarely does.

The sources are numbered from 1 in the order they are rendered, the model is asked to cite them
as ``[n]``, and :func:`citations` maps the markers of an answer back to its sources.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.contract import ChatTurn, Citation, Source
from broker.settings import GenerationSettings

SYSTEM_PROMPT = (
    "You are a precise assistant. Answer the question using only the numbered context passages, "
    "and cite the passages you use by their number in square brackets, like [1]. "
    "Answer in one or two sentences. If the passages do not contain the answer, say that you do not know."
)
# "[2]", and each number of "[1, 3]" or "[1][3]".
_MARKERS = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    text: str
    prompt_tokens: int
    sources_used: int
    sources_dropped: int
    # The sources as numbered in the prompt: [1] is numbered[0].
    numbered: tuple[Source, ...] = ()
    turns_used: int = 0
    turns_dropped: int = 0


def _ordered(sources: Sequence[Source]) -> list[Source]:
    # Best source first (a small model leans on what it reads first); ties by chunk id, so the
    # same sources always give the same tokens after the fixed system prefix (prefix cache).
    return sorted(sources, key=lambda s: (-s.score, s.chunk_id))


def _render(tokenizer: Any, query: str, sources: Sequence[Source], history: Sequence[ChatTurn] = ()) -> str:
    ordered = _ordered(sources)
    context = "\n\n".join(f"[{n}] {s.title}\n{s.text}" for n, s in enumerate(ordered, start=1))
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        *({"role": turn.role, "content": turn.content} for turn in history),
        {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}"},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompt(
    tokenizer: Any,
    query: str,
    sources: Sequence[Source],
    *,
    max_prompt_tokens: int,
    max_source_tokens: int = 0,
    history: Sequence[ChatTurn] = (),
    max_history_tokens: int = 0,
) -> BuiltPrompt:
    """Render the prompt within its budgets: the sources take at most ``max_source_tokens`` of
    it and the earlier turns at most ``max_history_tokens`` (0: no budget of their own), and the
    whole fits ``max_prompt_tokens``. Past a budget the lowest-scored sources go, and the oldest
    turns; past the whole, the oldest turns go first, then the lowest-scored sources.

    The API bounds the question (RAGLINE_MAX_QUERY_BYTES) far below the model's length, so the
    question alone always fits and a request never fails for length.
    """

    def count(kept: Sequence[Source], turns: Sequence[ChatTurn]) -> int:
        return _count(tokenizer, _render(tokenizer, query, kept, turns))

    bare = count([], []) if max_source_tokens > 0 or max_history_tokens > 0 else 0
    kept = sorted(sources, key=lambda s: -s.score)
    while max_source_tokens > 0 and kept and count(kept, []) > bare + max_source_tokens:
        kept = kept[:-1]
    turns = list(history)
    while max_history_tokens > 0 and turns and count([], turns) > bare + max_history_tokens:
        turns = turns[1:]
    while True:
        text = _render(tokenizer, query, kept, turns)
        n_tokens = _count(tokenizer, text)
        if n_tokens <= max_prompt_tokens or not (kept or turns):
            break
        if turns:
            turns = turns[1:]
        else:
            kept = kept[:-1]
    return BuiltPrompt(
        text=text,
        prompt_tokens=n_tokens,
        sources_used=len(kept),
        sources_dropped=len(sources) - len(kept),
        numbered=tuple(_ordered(kept)),
        turns_used=len(turns),
        turns_dropped=len(history) - len(turns),
    )


def citations(answer: str, numbered: Sequence[Source]) -> list[Citation]:
    """The sources an answer cites as ``[n]``, in order of first citation; a number that names
    no source of the prompt is ignored."""
    cited: list[Citation] = []
    seen: set[int] = set()
    for group in _MARKERS.findall(answer):
        for marker in (int(n) for n in group.split(",")):
            if marker in seen or not 1 <= marker <= len(numbered):
                continue
            seen.add(marker)
            s = numbered[marker - 1]
            cited.append(
                Citation(marker=marker, chunk_id=s.chunk_id, source=s.source, title=s.title, anchor=s.anchor)
            )
    return cited


def build_rag_prompt(
    settings: GenerationSettings,
    tokenizer: Any,
    query: str,
    sources: Sequence[Source],
    *,
    history: Sequence[ChatTurn] = (),
    max_tokens: int | None = None,
) -> BuiltPrompt:
    """The prompt the generation worker sends for a request, within the settings' budgets and
    leaving room for the answer's ``max_tokens`` (the setting's when None)."""
    answer_tokens = max_tokens or settings.max_new_tokens
    return build_prompt(
        tokenizer,
        query,
        sources,
        max_prompt_tokens=settings.max_model_len - answer_tokens,
        max_source_tokens=settings.max_source_tokens,
        history=history,
        max_history_tokens=settings.max_history_tokens,
    )
