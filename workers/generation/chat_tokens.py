"""Chat prompts as token ids in which only the chat template's own text can be a control token.

A model's tokenizer turns the text ``<|im_start|>`` into the template's control token wherever it
appears, so a question, an earlier turn or a retrieved document holding it would open a turn of
its own (a document starting ``<|im_start|>system`` would speak as the system to everyone whose
query retrieves it). Prompts are therefore never handed to an engine as text:

- the template is rendered once per sequence of roles, with a placeholder for each message's
  content; the text around the placeholders is the template's own and is tokenized as usual,
  its control tokens recognised;
- every content (the system prompt, each turn, each piece of the RAG message) is tokenized on
  its own with the special tokens split: ``<|im_start|>`` in it becomes the plain tokens of
  ``<``, ``|``, ``im`` ...; the model reads the characters, never the control token;
- the prompt's ids are the pieces' ids joined, and the engines are given those ids.

Each kind of tokenization runs on its own copy of the tokenizer's Rust backend. The Hugging Face
wrapper's ``split_special_tokens`` flips a flag on its one backend before encoding, so on the
generation worker's threads a content could be encoded while another thread had the flag off.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Stand in for each message's content while the template is rendered; private-use characters,
# so the template's own text never holds them.
_SLOT = "\ue000{}\ue001"
# Frames kept: one per sequence of roles seen (a conversation's turns alternate, so few are).
_MAX_FRAMES = 256


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    ids: tuple[int, ...]


class ChatTokens:
    """Tokenizes a chat template's own text and untrusted contents apart; shared by threads."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(f"{type(tokenizer).__name__} has no Rust backend: a fast tokenizer is needed")
        self._hf = tokenizer
        self._template = Tokenizer.from_str(backend.to_str())
        self._template.encode_special_tokens = False
        self._content = Tokenizer.from_str(backend.to_str())
        self._content.encode_special_tokens = True
        self._frames: dict[tuple[str, ...], tuple[Piece, ...]] = {}
        self._lock = threading.Lock()

    def content(self, text: str) -> Piece:
        """Untrusted text: no substring of it becomes a special token."""
        return Piece(text, tuple(self._content.encode(text, add_special_tokens=False).ids))

    def frame(self, roles: Sequence[str]) -> tuple[Piece, ...]:
        """The template's own text around the contents of messages of these roles, with the
        generation prompt: one piece more than there are messages (piece i comes before content i)."""
        key = tuple(roles)
        with self._lock:
            cached = self._frames.get(key)
        if cached is not None:
            return cached
        messages = [{"role": role, "content": _SLOT.format(i)} for i, role in enumerate(key)]
        rendered = self._hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        texts = []
        for i in range(len(key)):
            before, slot, rendered = rendered.partition(_SLOT.format(i))
            if not slot or _SLOT.format(i) in rendered:
                raise ValueError(f"the chat template does not put message {i}'s content in verbatim, once")
            texts.append(before)
        texts.append(rendered)
        frame = tuple(Piece(t, tuple(self._template.encode(t, add_special_tokens=False).ids)) for t in texts)
        with self._lock:
            if len(self._frames) >= _MAX_FRAMES:
                del self._frames[next(iter(self._frames))]
            self._frames[key] = frame
        return frame
