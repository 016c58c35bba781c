"""Does the prompt's layout for the prefix cache cost answers? Layouts side by side, one run.

    .venv/bin/python -m bench.prompt_layout [--questions 40] [--max-tokens 64]

The Python 3.11 FAQ (Debian's python3.11-doc) in an index of its own; each of its first N
questions (bench/data/pydocs_faq.tsv) retrieves its top 5, and the same sources go into prompts
laid out each way (workers/generation/prompt.py):

- ``score``: best first, as prompts were before this layout;
- ``canonical``: all by chunk id;
- ``best-first``: the best first, the others by chunk id, as the worker renders them;
- a layout with ``+pad-nl``, ``+pad-nn`` or ``+pad-space``: the instructions also padded to whole
  128-token blocks (the CPU backend's) with newline, paragraph-break or space tokens.

One vLLM engine (SmolLM2-135M-Instruct, float32, eager, greedy, the worker's frequency penalty)
answers them all. SmolLM2-135M seldom cites, so what an answer draws on is read from its words
(those of four letters or more, not in the question): per layout, how often the FAQ section that
answers the question is the source sharing most of them, the share of them found in it, how
often the answer says it does not know or cites nothing, how often its text is the ``score``
layout's, and the prompt tokens the engine found in its prefix cache. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Source

from bench.env import share_models
from ragline.eval import Label, matches, read_labels

DOCS = Path("/usr/share/doc/python3.11/html/_sources")
LABELS = Path(__file__).parent / "data" / "pydocs_faq.tsv"
INDEX = "pyfaq-layout"
LAYOUTS = ("score", "canonical", "best-first", "best-first+pad-nl", "best-first+pad-nn")
FILLERS = {"nl": "\n", "nn": "\n\n", "space": " "}


def retrieve(settings: Settings, labels: list[Label], top_k: int) -> list[list[Source]]:
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.embedder import Embedder
    from ragline.workers.retrieval.ingest import ingest

    embedder = Embedder(settings.retrieval)
    ingest(settings, [DOCS / "faq"], index_name=INDEX, embedder=embedder, progress=False)
    info = indexes.lookup(sync_client(settings.redis), Keys(settings.redis.key_prefix), INDEX)
    assert info is not None
    loaded = index_store.load(info, ef_search=settings.retrieval.hnsw_ef_search)
    vectors = embedder.encode([label.question for label in labels])
    out = []
    for hits in loaded.search(vectors, top_k):
        out.append(
            [
                Source(
                    chunk_id=c.chunk_id, source=c.source, title=c.title, text=c.text, score=s, anchor=c.anchor
                )
                for c, s in hits
            ]
        )
    return out


def ordered_as(order: str, sources: list[Source]) -> list[Source]:
    """The sources, changed where the prompt does not show it, so that the prompt renders them
    in ``order``: ``score`` (ids that sort best first), ``canonical`` (all by chunk id: equal
    scores, so no best goes first) or ``best-first`` (as they are: the worker's order)."""
    if order == "score":
        ranked = sorted(sources, key=lambda s: -s.score)
        return [
            s.model_copy(update={"chunk_id": f"{rank:03d}-{s.chunk_id}"}) for rank, s in enumerate(ranked)
        ]
    if order == "canonical":
        return [s.model_copy(update={"score": 0.5}) for s in sources]
    if order == "best-first":
        return sources
    raise SystemExit(f"unknown order {order!r}: score, canonical or best-first")


def forget(settings: Settings, home: Path) -> None:
    """The run's index: its keys in Redis and its folder (the shared models stay)."""
    import shutil

    from ragline.broker.redis.pool import sync_client

    client = sync_client(settings.redis)
    for key in client.scan_iter(match=f"{settings.redis.key_prefix}*", count=1000):
        client.delete(key)
    shutil.rmtree(home, ignore_errors=True)


_STOP = frozenset(
    "that this with from have there their which when what where about into than then they them "  # noqa: SIM905
    "these those been were will would could should also does such only some other more most".split()
)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z_]{3,}", text.lower()) if w not in _STOP}


def score_layout(
    layout: str,
    labels: list[Label],
    retrieved: list[list[Source]],
    prompts: dict[tuple[str, int], Any],
    answers: dict[tuple[str, int], str],
    cached: dict[tuple[str, int], int],
) -> dict[str, float]:
    """How the answers of one layout use their sources (the module's docstring)."""
    from ragline.workers.generation.citations import citations

    n = len(labels)
    draws = share = unknown = uncited = same = 0.0
    for i, label in enumerate(labels):
        text = answers[layout, i]
        words = content_words(text) - content_words(label.question)
        overlaps = [(len(words & content_words(s.text)), matches(s, label)) for s in retrieved[i]]
        gold = max((o for o, is_gold in overlaps if is_gold), default=-1)
        if words and gold >= 0:
            draws += gold > 0 and gold >= max(o for o, _ in overlaps)
            share += gold / len(words)
        unknown += "not know" in text.lower() or "don't know" in text.lower()
        uncited += not citations(text, prompts[layout, i].by_given_number)
        same += text.strip() == answers.get(("score", i), "").strip()
    return {
        "draws_on_gold": draws / n,
        "gold_word_share": share / n,
        "does_not_know": unknown / n,
        "uncited": uncited / n,
        "same_as_score": same / n,
        "prompt_tokens_mean": sum(prompts[layout, i].prompt_tokens for i in range(n)) / n,
        "cached_tokens_mean": sum(cached[layout, i] for i in range(n)) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="score first")
    parser.add_argument("--answers", type=Path, help="write every answer here (JSON)")
    args = parser.parse_args()
    if not DOCS.exists():
        raise SystemExit(f"{DOCS} not found: apt-get install python3.11-doc")

    from ragline.workers.generation.citations import MarkerRenumbering
    from ragline.workers.generation.engine import EngineHost
    from ragline.workers.generation.model_prep import generation_model_path, prepare_default_model
    from ragline.workers.generation.prompt import BuiltPrompt, PromptBuilder, build_rag_prompt
    from transformers import AutoTokenizer

    home = Path(tempfile.mkdtemp(prefix="ragline-layout-"))
    share_models(home)
    settings = Settings().replace(
        home=home,
        redis_url=args.redis_url,
        key_prefix=f"ragline-layout-{uuid.uuid4().hex[:8]}",
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=8,
        cpu_kvcache_space_gib=1,  # 8 prompts of ~1,100 tokens need far less; the box is shared
        max_new_tokens=args.max_tokens,
    )
    prepare_default_model(settings)
    labels = read_labels(LABELS)[: args.questions]
    retrieved = retrieve(settings, labels, top_k=5)
    tokenizer = AutoTokenizer.from_pretrained(generation_model_path(settings))
    builders = {}
    for layout in args.layouts.split(","):
        _, _, filler = layout.partition("+pad-")
        builders[layout] = (
            PromptBuilder(tokenizer, block_tokens=128, filler=FILLERS[filler])
            if filler
            else PromptBuilder(tokenizer)
        )
    prompts: dict[tuple[str, int], BuiltPrompt] = {}
    for layout, builder in builders.items():
        order = layout.partition("+")[0]
        for i, (label, sources) in enumerate(zip(labels, retrieved, strict=True)):
            given = ordered_as(order, sources)
            prompts[layout, i] = build_rag_prompt(settings.generation, builder, label.question, given)

    engine = EngineHost(settings.generation, generation_model_path(settings))
    engine.start()
    answers: dict[tuple[str, int], str] = {}
    cached: dict[tuple[str, int], int] = {}
    lock = threading.Lock()
    try:
        print(f"engine block: {engine.prefix_block_tokens()} tokens", flush=True)

        def answer(key: tuple[str, int]) -> None:
            built = prompts[key]
            deltas = list(
                engine.stream(
                    f"layout-{uuid.uuid4().hex[:8]}",
                    built.token_ids,
                    max_tokens=args.max_tokens,
                    timeout_s=900,
                )
            )
            markers = MarkerRenumbering(built.renumbering)
            with lock:
                answers[key] = markers.feed("".join(d.text for d in deltas)) + markers.flush()
                cached[key] = max(d.cached_tokens for d in deltas)
                if len(answers) % 8 == 0:
                    print(f"{len(answers)}/{len(prompts)} answered", flush=True)

        with ThreadPoolExecutor(settings.generation.max_num_seqs) as pool:
            list(pool.map(answer, prompts))
    finally:
        engine.shutdown()
        forget(settings, home)

    results = {
        layout: score_layout(layout, labels, retrieved, prompts, answers, cached) for layout in builders
    }
    for layout, r in results.items():
        print(
            f"{layout:20s} draws on the answering section {r['draws_on_gold']:.2f}, "
            f"its words {r['gold_word_share']:.2f} of the answer's, says it does not know "
            f"{r['does_not_know']:.2f}, cites nothing {r['uncited']:.2f}, same text as score "
            f"{r['same_as_score']:.2f}; prompt {r['prompt_tokens_mean']:.0f} tokens, "
            f"{r['cached_tokens_mean']:.0f} from the prefix cache",
            flush=True,
        )
    if args.answers:
        args.answers.write_text(
            json.dumps(
                [
                    {"layout": layout, "question": labels[i].question, "answer": answers[layout, i]}
                    for layout, i in prompts
                ],
                indent=1,
            )
        )
    print(json.dumps({"questions": len(labels), "layouts": results}))


if __name__ == "__main__":
    main()
