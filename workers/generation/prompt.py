"""RAG prompts as token ids: laid out for vLLM's prefix cache, and no text in them can steer the template.

The layout, in the chat template's turns: the system turn (the instructions), the conversation's
earlier turns (the chat endpoint's), then one user turn ``Context:\\n[1] title\\ntext\\n\\n[2] ...
\\n\\nQuestion: ...`` and the template's generation prompt.

The engine reuses cached KV state only in whole blocks (``block_tokens``: 128 tokens on vLLM's CPU
backend, 16 on most GPUs; the worker reads it from its engine). Two things make it reuse them:

- the instructions are padded with filler tokens so that everything before the first content that
  varies (the template's head, the system prompt, the next turn's header) fills whole blocks:
  every request reuses those blocks, however short the instructions;
- the sources follow in an order that depends on their scores as little as the model allows:
  the best first, then the others by chunk id (the chunks of one document together, in reading
  order). Two questions that retrieve the same sources with the same best share their blocks
  whatever order the scores put the others in. Fully by chunk id would share more, but cost
  answers (docs/performance.md, "The prompt's layout"). An answer's ``[n]`` counts in this
  order; the worker rewrites its markers to the sources' order as the client has them
  (``workers/generation/citations.py``).

Every content (the question, each turn, each source's title and text) is tokenized with special
tokens split (``workers/generation/chat_tokens.py``): the model reads a ``<|im_start|>`` typed by a
user or found in a document as plain characters, never as the template's control token.

Prefill time grows with the prompt, so the sources get a token budget of their own
(``max_source_tokens``): past it the lowest-scored are dropped, and the answer reports how many.
The earlier turns have one too (``max_history_tokens``); a prompt over a budget drops the oldest
turns first, and only then sources: the sources ground the answer, an old turn rarely does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ragline.broker.config.settings import GenerationSettings
from ragline.broker.contract.messages import ChatTurn, Source
from ragline.workers.generation.chat_tokens import ChatTokens, Piece

SYSTEM_PROMPT = (
    "You are a precise assistant. Answer the question using only the numbered context passages, "
    "and cite the passages you use by their number in square brackets, like [1]. "
    "Answer in one or two sentences. If the passages do not contain the answer, say that you do not know."
)
# Pads the instructions to whole KV blocks: one token, repeated, after the system prompt. A
# paragraph break reads as blank lines; spaces cost answers (docs/performance.md).
FILLER = "\n\n"


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    # What the engine is given.
    token_ids: tuple[int, ...]
    # The text of the ids, for reading (logs, tests); never tokenized again.
    text: str
    sources_used: int
    sources_dropped: int
    # The sources as numbered in the prompt: [1] is numbered[0].
    numbered: tuple[Source, ...] = ()
    # Each numbered source's place in the sources given, from 1: the number a client knows it by.
    given_numbers: tuple[int, ...] = ()
    turns_used: int = 0
    turns_dropped: int = 0
    # The tokens before the first content that varies: the same for every prompt with the same
    # turns' roles, a whole number of the engine's KV blocks.
    head_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def renumbering(self) -> dict[int, int]:
        """The prompt's number of each source -> its number among the sources given."""
        return {n: given for n, given in enumerate(self.given_numbers, start=1)}

    @property
    def by_given_number(self) -> dict[int, Source]:
        return dict(zip(self.given_numbers, self.numbered, strict=True))


def prompt_order(sources: Sequence[tuple[int, Source]]) -> list[tuple[int, Source]]:
    """(place given, source) pairs in the order the prompt renders them: the best first (SmolLM2
    leans on the passage it reads first: with the answering one second, it answered from
    another), then the rest by chunk id, whatever their scores."""
    if not sources:
        return []
    best = min(sources, key=lambda pair: (-pair[1].score, pair[1].chunk_id, pair[0]))
    rest = sorted(
        (pair for pair in sources if pair is not best), key=lambda pair: (pair[1].chunk_id, pair[0])
    )
    return [best, *rest]


class PromptBuilder:
    """Builds prompts for one tokenizer and KV block size; safe to share between threads."""

    def __init__(self, tokenizer: Any, *, block_tokens: int = 1, filler: str = FILLER) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self._chat = ChatTokens(tokenizer)
        self._block_tokens = block_tokens
        self._filler = self._chat.content(filler)
        if len(self._filler.ids) != 1:
            raise ValueError(f"the filler {filler!r} is {len(self._filler.ids)} tokens, not one")
        self._system = self._chat.content(SYSTEM_PROMPT)

    @property
    def block_tokens(self) -> int:
        return self._block_tokens

    def _pieces(
        self,
        content: Callable[[str], Piece],
        query: str,
        kept: Sequence[tuple[int, Source]],
        turns: Sequence[ChatTurn],
    ) -> tuple[list[Piece], int]:
        """The prompt's pieces, and how many tokens its padded head is."""
        frame = self._chat.frame(["system", *(t.role for t in turns), "user"])
        head = len(frame[0].ids) + len(self._system.ids) + len(frame[1].ids)
        pad = -head % self._block_tokens
        pieces = [frame[0], self._system]
        if pad:
            pieces.append(Piece(self._filler.text * pad, self._filler.ids * pad))
        pieces.append(frame[1])
        for i, turn in enumerate(turns, start=1):
            pieces += [content(turn.content), frame[i + 1]]
        # The label and the source apart, so a source's tokens are the same whatever its number
        # (the boundary falls where the tokenizer's own pre-tokenizer splits: before the space).
        for n, (_, source) in enumerate(prompt_order(kept), start=1):
            pieces.append(content(("Context:\n" if n == 1 else "\n\n") + f"[{n}]"))
            pieces.append(content(f" {source.title}\n{source.text}"))
        pieces.append(content(("" if kept else "Context:\n") + f"\n\nQuestion: {query}"))
        pieces.append(frame[-1])
        return pieces, head + pad

    def build(
        self,
        query: str,
        sources: Sequence[Source],
        *,
        max_prompt_tokens: int,
        max_source_tokens: int = 0,
        history: Sequence[ChatTurn] = (),
        max_history_tokens: int = 0,
    ) -> BuiltPrompt:
        """The prompt within its budgets: the sources take at most ``max_source_tokens`` of it
        and the earlier turns at most ``max_history_tokens`` (0: no budget of their own), and
        the whole fits ``max_prompt_tokens``. Past a budget the lowest-scored sources go, and the
        oldest turns; past the whole, the oldest turns go first, then the lowest-scored sources.

        The API bounds the question (RAGLINE_MAX_QUERY_BYTES) far below the model's length, so
        the question alone always fits and a request never fails for length.
        """
        tokenized: dict[str, Piece] = {}

        def content(text: str) -> Piece:
            piece = tokenized.get(text)
            if piece is None:
                piece = tokenized[text] = self._chat.content(text)
            return piece

        def count(kept: Sequence[tuple[int, Source]], turns: Sequence[ChatTurn]) -> int:
            return sum(len(p.ids) for p in self._pieces(content, query, kept, turns)[0])

        bare = count([], []) if max_source_tokens > 0 or max_history_tokens > 0 else 0
        # Best first, so that the lowest-scored is the last, and the first dropped.
        kept = sorted(enumerate(sources, start=1), key=lambda pair: -pair[1].score)
        while max_source_tokens > 0 and kept and count(kept, []) > bare + max_source_tokens:
            kept = kept[:-1]
        turns = list(history)
        while max_history_tokens > 0 and turns and count([], turns) > bare + max_history_tokens:
            turns = turns[1:]
        while True:
            pieces, head_tokens = self._pieces(content, query, kept, turns)
            n_tokens = sum(len(p.ids) for p in pieces)
            if n_tokens <= max_prompt_tokens or not (kept or turns):
                break
            if turns:
                turns = turns[1:]
            else:
                kept = kept[:-1]
        ordered = prompt_order(kept)
        return BuiltPrompt(
            token_ids=tuple(i for p in pieces for i in p.ids),
            text="".join(p.text for p in pieces),
            sources_used=len(kept),
            sources_dropped=len(sources) - len(kept),
            numbered=tuple(s for _, s in ordered),
            given_numbers=tuple(n for n, _ in ordered),
            turns_used=len(turns),
            turns_dropped=len(history) - len(turns),
            head_tokens=head_tokens,
        )


@lru_cache(maxsize=8)
def builder_for(tokenizer: Any, block_tokens: int = 1) -> PromptBuilder:
    """A builder kept per tokenizer (by identity) and block size: making one parses the
    tokenizer twice, more than a prompt costs."""
    return PromptBuilder(tokenizer, block_tokens=block_tokens)


def build_prompt(
    tokenizer: Any,
    query: str,
    sources: Sequence[Source],
    *,
    max_prompt_tokens: int,
    max_source_tokens: int = 0,
    history: Sequence[ChatTurn] = (),
    max_history_tokens: int = 0,
    block_tokens: int = 1,
) -> BuiltPrompt:
    """One prompt (:meth:`PromptBuilder.build`) from a bare tokenizer."""
    return builder_for(tokenizer, block_tokens).build(
        query,
        sources,
        max_prompt_tokens=max_prompt_tokens,
        max_source_tokens=max_source_tokens,
        history=history,
        max_history_tokens=max_history_tokens,
    )


def build_rag_prompt(
    settings: GenerationSettings,
    builder: PromptBuilder | Any,
    query: str,
    sources: Sequence[Source],
    *,
    history: Sequence[ChatTurn] = (),
    max_tokens: int | None = None,
) -> BuiltPrompt:
    """The prompt the generation worker sends for a request, within the settings' budgets and
    leaving room for the answer's ``max_tokens`` (the setting's when None). ``builder`` may be a
    bare tokenizer (benchmarks, tests): its prompts are not padded to KV blocks."""
    if not isinstance(builder, PromptBuilder):
        builder = builder_for(builder)
    answer_tokens = max_tokens or settings.max_new_tokens
    return builder.build(
        query,
        sources,
        max_prompt_tokens=settings.max_model_len - answer_tokens,
        max_source_tokens=settings.max_source_tokens,
        history=history,
        max_history_tokens=settings.max_history_tokens,
    )
