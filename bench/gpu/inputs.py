"""bench/gpu/run.py's inputs: a model folder with a config and a tokenizer but no weights, and RAG
prompts of a fixed size built by the generation worker's own prompt builder."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragline.broker.config.settings import GenerationSettings
from ragline.broker.contract.messages import Source

# Meta-Llama-3-8B's config.json as published, in the layout every transformers and vLLM release
# reads (a config written by the installed transformers' LlamaConfig would carry that release's
# own layout, which an older vLLM on the GPU host may not read). The vocabulary and the special
# token ids are the tokenizer's, set by write_dummy_model.
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}
# What the prepared model folder holds besides its tokenizer: not copied into a dummy folder.
_NOT_TOKENIZER = {"config.json", "generation_config.json", ".ragline-prepared"}


def write_dummy_model(
    dest: Path, tokenizer_dir: Path, shape: dict[str, Any] = LLAMA3_8B, *, dtype: str = "bfloat16"
) -> Path:
    """A folder vLLM loads with ``load_format="dummy"`` and transformers builds with
    ``from_config``: ``shape``'s config with the vocabulary of the tokenizer copied beside it."""
    from transformers import AutoTokenizer

    dest.mkdir(parents=True, exist_ok=True)
    for path in tokenizer_dir.iterdir():
        if path.is_file() and path.name not in _NOT_TOKENIZER and path.suffix != ".safetensors":
            shutil.copy2(path, dest / path.name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = {
        **shape,
        # len(): the base vocabulary and any added tokens, every id the tokenizer can produce.
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "torch_dtype": dtype,
    }
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


@dataclass(frozen=True, slots=True)
class RagRequest:
    question: str
    sources: tuple[Source, ...]
    prompt: str  # what the generation worker builds from the question and the sources
    prompt_tokens: int


def faq_sections(docs: Path) -> list[tuple[str, str, str]]:
    """(title, text, file) of every section of the Python FAQ, in the files' order."""
    from ragline.workers.retrieval.readers import read_sections

    sections = []
    for path in sorted((docs / "faq").glob("*.rst.txt")):
        sections += [(s.title, s.text, str(path)) for s in read_sections(path)]
    return sections


def rag_requests(
    settings: GenerationSettings,
    tokenizer: Any,
    docs: Path,
    n: int,
    *,
    min_prompt_tokens: int = 1000,
    max_prompt_tokens: int = 1500,
) -> list[RagRequest]:
    """``n`` FAQ questions, each with its own answer section and the sections after it as
    sources, added until the prompt the worker would build holds at least ``min_prompt_tokens``; a
    source past the worker's source budget is cut to what fits, so the worker drops none and
    builds exactly this prompt."""
    from ragline.workers.generation.prompt import build_rag_prompt

    sections = faq_sections(docs)
    questions = [i for i, (title, _, _) in enumerate(sections) if title.endswith("?")]
    if len(questions) < n:
        raise ValueError(f"{docs / 'faq'} has {len(questions)} questions, {n} wanted")
    out = []
    for i in questions[:n]:
        question = sections[i][0]

        def build(sources: list[Source], question: str = question) -> Any:
            return build_rag_prompt(settings, tokenizer, question, sources)

        sources: list[Source] = []
        built = build(sources)
        for j in range(len(sections)):
            title, text, path = sections[(i + j) % len(sections)]

            def source(words: list[str], j: int = j, title: str = title, path: str = path) -> Source:
                # Scores fall with distance from the question's own section: the prompt lists
                # them in that order, as it would retrieved ones.
                return Source(
                    chunk_id=f"{path}:{j}",
                    title=title,
                    text=" ".join(words),
                    source=path,
                    score=0.9 - j / 1000,
                )

            words = text.split()
            candidate = build([*sources, source(words)])
            if candidate.sources_dropped:
                # The largest head of this section that fits the budget (none may fit).
                lo, hi = 0, len(words)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if build([*sources, source(words[:mid])]).sources_dropped:
                        hi = mid - 1
                    else:
                        lo = mid
                if lo:
                    sources.append(source(words[:lo]))
                    built = build(sources)
                break
            sources, built = [*sources, source(words)], candidate
            if built.prompt_tokens >= min_prompt_tokens:
                break
        if not min_prompt_tokens <= built.prompt_tokens <= max_prompt_tokens:
            raise ValueError(
                f"the prompt for {question!r} holds {built.prompt_tokens} tokens, not "
                f"{min_prompt_tokens}-{max_prompt_tokens}: "
                "the source budget (RAGLINE_MAX_SOURCE_TOKENS) does not allow that range"
            )
        out.append(RagRequest(question, tuple(sources), built.text, built.prompt_tokens))
    return out
