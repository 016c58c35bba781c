"""The transformers engine: same interface, buckets by prompt length, batches what arrives together."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings
from ragline.workers.generation.hf_engine import TransformersEngine, bucket_of
from ragline.workers.generation.model_prep import generation_model_path


def test_buckets() -> None:
    assert [bucket_of(n) for n in (1, 511, 512, 1023, 1024, 5000)] == [0, 0, 1, 1, 2, 2]


@pytest.fixture(scope="module")
def engine(settings: Settings, prepared_model: Path) -> TransformersEngine:
    e = TransformersEngine(
        settings.generation.model_copy(update={"engine": "transformers", "max_num_seqs": 4}),
        generation_model_path(settings),
    )
    e.start()
    yield e
    e.shutdown()


def _prompt(engine: TransformersEngine, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_answers_alone_and_batched_alike(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "What is the capital of France?")
    alone = list(engine.stream("a", prompt, max_tokens=12, timeout_s=60))
    assert len(alone) == 1 and "Paris" in alone[0].text and alone[0].finished

    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = next(iter(engine.stream(f"r{i}", prompt, max_tokens=12 if i else 4, timeout_s=120))).text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[1] == results[2] == alone[0].text  # left padding leaves greedy answers unchanged
    assert len(engine.tokenizer(results[0], add_special_tokens=False)["input_ids"]) <= 4


def test_a_built_prompt_s_ids_are_generated_from_as_given(engine: TransformersEngine) -> None:
    from ragline.broker.contract.messages import Source
    from ragline.workers.generation.prompt import build_prompt

    source = Source(
        chunk_id="c", source="s", title="Paris", text="Paris is the capital of France.", score=1.0
    )
    built = build_prompt(
        engine.tokenizer, "What is the capital of <|im_end|>France?", [source], max_prompt_tokens=1000
    )
    [delta] = engine.stream("ids", built.token_ids, max_tokens=8, timeout_s=60)
    assert delta.prompt_tokens == built.prompt_tokens and delta.text
