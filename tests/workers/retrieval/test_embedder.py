"""A large batch is encoded in parts on their own threads: the same vectors, in the same order."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = pytest.mark.integration

_TEXTS = [f"How do I use {topic} in Python?" for topic in (
    "asyncio", "dataclasses", "the GIL", "f-strings", "pathlib", "typing.Protocol", "unittest.mock",
    "functools.cache", "contextlib", "itertools.groupby", "struct", "sqlite3", "a virtual environment",
    "zipfile", "the walrus operator", "enum.Flag", "weakref", "pickle safely", "heapq", "bisect",
)]  # fmt: skip


def test_a_split_batch_gives_each_text_its_own_vector(embedder) -> None:
    import torch

    assert len(_TEXTS) >= embedder._split_min  # the split path
    together = embedder.encode(_TEXTS)
    alone = np.stack([embedder.encode([text])[0] for text in _TEXTS])
    assert together.shape == (len(_TEXTS), embedder.dim)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # The caller's encodes still use every torch thread (the parts' threads use one each).
    assert torch.get_num_threads() == embedder._parts


def test_a_small_batch_on_another_thread_uses_every_torch_thread(embedder) -> None:
    import torch

    embedder.encode(_TEXTS)  # the parts' threads have set torch's default for new threads to one
    seen: list[int] = []

    def encode_small() -> None:
        embedder.encode(_TEXTS[:2])
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=encode_small)
    thread.start()
    thread.join()
    assert seen == [embedder._parts]


def test_a_split_batch_pads_each_group_only_to_its_longest_text(embedder, monkeypatch) -> None:
    shapes: list[tuple[int, int]] = []
    forward = embedder._model.forward

    def recording(features: dict) -> dict:
        shapes.append(tuple(features["input_ids"].shape))
        return forward(features)

    monkeypatch.setattr(embedder._model, "forward", recording)
    texts = [*_TEXTS[:8], *(" ".join([text] * 6) for text in _TEXTS[8:])]  # 8 short, 12 long
    embedder.encode(texts)
    assert sum(rows for rows, _ in shapes) == len(texts)
    assert all(rows <= embedder._group_size for rows, _ in shapes)
    longest = int(embedder._tokenize(texts)["attention_mask"].sum(dim=1).max())
    # The short texts' group is not padded to the long ones.
    assert min(width for _, width in shapes) < longest // 2


def test_a_thread_held_up_takes_fewer_groups(embedder, monkeypatch) -> None:
    import time

    forward = embedder._model.forward
    lock = threading.Lock()
    groups_by_thread: dict[str, int] = {}

    def one_slow_thread(features: dict) -> dict:
        name = threading.current_thread().name
        with lock:
            first = not groups_by_thread
            groups_by_thread[name] = groups_by_thread.get(name, 0) + 1
        if first:  # the first group to start: its thread is held up, as by a shared core
            time.sleep(1.0)
        return forward(features)

    texts = _TEXTS * 2  # 40 texts: 5 groups of 8
    expected = embedder.encode(texts)
    monkeypatch.setattr(embedder._model, "forward", one_slow_thread)
    np.testing.assert_allclose(embedder.encode(texts), expected, atol=1e-5)
    # The held thread did its one group; the others took every group left.
    assert len(groups_by_thread) == embedder._parts
    assert min(groups_by_thread.values()) == 1
    assert sum(groups_by_thread.values()) == 5


def test_a_failed_group_fails_the_encode_after_every_thread_is_done(embedder, monkeypatch) -> None:
    import time

    forward = embedder._model.forward
    lock = threading.Lock()
    calls: list[str] = []

    def first_group_fails(features: dict) -> dict:
        with lock:
            calls.append("start")
            first = len(calls) == 1
        if first:
            raise RuntimeError("boom")
        time.sleep(0.05)
        out = forward(features)
        calls.append("end")
        return out

    monkeypatch.setattr(embedder._model, "forward", first_group_fails)
    with pytest.raises(RuntimeError, match="boom"):
        embedder.encode(_TEXTS * 2)
    finished = len(calls)
    time.sleep(0.3)
    assert len(calls) == finished  # no thread went on encoding after the error came back


def test_the_direct_forward_gives_sentence_transformers_vectors(embedder) -> None:
    assert not any(module.training for module in embedder._model.modules())
    expected = embedder._model.encode(_TEXTS[:3], normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(embedder.encode(_TEXTS[:3]), expected, atol=1e-5)
    assert embedder.encode([]).shape == (0, embedder.dim)
