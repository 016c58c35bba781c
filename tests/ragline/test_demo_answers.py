"""The demo's answers are readable: on the demo corpus, with the demo's questions and the settings a
user gets (the host's dtype, the default penalty and answer length), no answer says a sentence twice.

Retrieval, prompt building and the vLLM engine are ragline's own (ingest, index, the worker's prompt
builder, EngineHost); only the queues between them are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings

from ragline.demo import QUESTIONS, write_demo_corpus

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def repeated_sentences(answer: str) -> list[str]:
    seen: set[str] = set()
    repeated = []
    for sentence in _SENTENCE_END.split(answer):
        key = " ".join(sentence.lower().split()).rstrip(".!?")
        if len(key.split()) < 4:  # "Yes." twice is no loop
            continue
        if key in seen:
            repeated.append(sentence)
        seen.add(key)
    return repeated


def test_repeated_sentences_finds_a_loop() -> None:
    loop = "It is a feature of the interpreter. It is a feature of the interpreter. Yes. Yes."
    assert repeated_sentences(loop) == ["It is a feature of the interpreter."]
    assert repeated_sentences("One thing is said here. Another thing is said there.") == []


def test_demo_answers_say_no_sentence_twice(
    settings: Settings, prepared_model: Path, embedder, tmp_path: Path
) -> None:
    from ragline.broker.contract.messages import Source
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes
    from ragline.workers.generation.engine import EngineHost
    from ragline.workers.generation.model_prep import generation_model_path
    from ragline.workers.generation.prompt import PromptBuilder, build_rag_prompt
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.ingest import ingest
    from transformers import AutoTokenizer

    defaults = Settings()
    demo = settings.replace(
        home=tmp_path,
        key_prefix="ragline-demo-answers",
        dtype=defaults.generation.dtype,
        max_new_tokens=defaults.generation.max_new_tokens,
        frequency_penalty=defaults.generation.frequency_penalty,
        chunk_words=defaults.retrieval.chunk_words,
        chunk_overlap_words=defaults.retrieval.chunk_overlap_words,
        max_num_seqs=4,
    )
    (tmp_path / "models").symlink_to(settings.models_dir.resolve(), target_is_directory=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_demo_corpus(corpus)
    ingest(demo, [corpus], index_name="demo", embedder=embedder, progress=False)
    info = indexes.lookup(sync_client(demo.redis), Keys(demo.redis.key_prefix), "demo")
    assert info is not None
    loaded = index_store.load(info, ef_search=demo.retrieval.hnsw_ef_search)
    tokenizer = AutoTokenizer.from_pretrained(prepared_model)

    engine = EngineHost(demo.generation, generation_model_path(demo))
    engine.start()
    builder = PromptBuilder(tokenizer, block_tokens=engine.prefix_block_tokens())  # as the worker's
    try:
        for i, question in enumerate(QUESTIONS):
            hits = loaded.search(embedder.encode([question]), 3)[0]
            sources = [
                Source(chunk_id=c.chunk_id, source=c.source, title=c.title, text=c.text, score=s)
                for c, s in hits
            ]
            prompt = build_rag_prompt(demo.generation, builder, question, sources)
            answer = "".join(
                d.text
                for d in engine.stream(
                    f"demo-{i}", prompt.token_ids, max_tokens=demo.generation.max_new_tokens, timeout_s=300
                )
            )
            assert answer.strip(), question
            assert repeated_sentences(answer) == [], f"{question!r} -> {answer!r}"
    finally:
        engine.shutdown()
