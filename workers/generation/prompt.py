"""RAG prompts built for vLLM's prefix cache: a fixed system prefix, then sources in a stable order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYSTEM_PROMPT = (
    "You are a precise assistant. Answer the question using only the numbered context passages. "
    "Answer in one or two sentences. If the passages do not contain the answer, say that you do not know."
)


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    text: str
    prompt_tokens: int
    sources_used: int
    sources_dropped: int


def _render(tokenizer: Any, query: str, sources: list[dict[str, Any]]) -> str:
    # Best source first (a small model leans on what it reads first); ties by chunk id, so the
    # same sources always give the same tokens after the fixed system prefix (prefix cache).
    ordered = sorted(sources, key=lambda s: (-s["score"], s["chunk_id"]))
    context = "\n\n".join(f"[{n}] {s['title']}\n{s['text']}" for n, s in enumerate(ordered, start=1))
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}"},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_prompt(
    tokenizer: Any, query: str, sources: list[dict[str, Any]], *, max_prompt_tokens: int
) -> BuiltPrompt:
    """Render the prompt, dropping the lowest-scored sources until it fits.

    The API bounds the question (RAGLINE_MAX_QUERY_BYTES) far below the model's length, so the
    question alone always fits and a request never fails for length.
    """
    kept = sorted(sources, key=lambda s: -s["score"])
    while True:
        text = _render(tokenizer, query, kept)
        n_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n_tokens <= max_prompt_tokens or not kept:
            break
        kept = kept[:-1]
    return BuiltPrompt(
        text=text, prompt_tokens=n_tokens, sources_used=len(kept), sources_dropped=len(sources) - len(kept)
    )
