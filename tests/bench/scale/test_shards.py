"""bench/scale/shards.py's pure parts: who serves which shard, the order of the queries, the
summary and its table."""

from __future__ import annotations

import math
from collections import Counter

from ragline.broker.state import shards

from bench.scale.shards import (
    CONFIGS,
    Latency,
    ShardRun,
    label,
    query_text,
    schedule,
    summarize,
    table,
    worker_selections,
)


def test_worker_j_holds_shard_j_of_every_index_and_the_selections_parse() -> None:
    selections = worker_selections((1, 2, 4))
    assert selections == ["scale1:0,scale2:0,scale4:0", "scale2:1,scale4:1", "scale4:2", "scale4:3"]
    held = [shards.parse_selection(s) for s in selections]
    every = [s for chosen in held for s in sorted(chosen or ())]
    assert len(every) == len(set(every)) == 1 + 2 + 4  # each shard held by exactly one worker
    assert "scale4.shard-3" in every


def test_each_round_asks_every_configuration_once_in_a_shuffled_order() -> None:
    order = schedule(50, CONFIGS, seed=1)
    assert [r for r, _ in order] == [r for r in range(50) for _ in CONFIGS]
    rounds = [tuple(name for r, name in order if r == i) for i in range(50)]
    assert all(sorted(r) == sorted(CONFIGS) for r in rounds)
    assert len(set(rounds)) > 5  # not one fixed order
    assert Counter(r[0] for r in rounds).keys() == set(CONFIGS)  # every one goes first sometimes
    assert order == schedule(50, CONFIGS, seed=1)


def test_query_texts_are_unique_and_alike_within_a_round() -> None:
    texts = [query_text(r, name) for r, name in schedule(40, CONFIGS)]
    assert len(set(texts)) == len(texts)
    first_round = [query_text(0, name) for name in CONFIGS]
    assert len({len(t) for t in first_round}) == 1
    assert len({t.split(" (case")[0] for t in first_round}) == 1


def test_summary_and_table() -> None:
    lat = summarize([0.010] * 98 + [0.020, 0.100], partial=1, errors=2)
    assert lat.timed == 100 and lat.partial == 1 and lat.errors == 2
    assert math.isclose(lat.p50_ms, 10.0) and 20.0 < lat.p99_ms < 100.0
    assert math.isnan(summarize([]).p99_ms)

    latency = {name: Latency(10, 10.0 + i, 20.0 + 5 * i) for i, name in enumerate(CONFIGS)}
    run = ShardRun(1_000_000, latency, {"scale": 600.0, "scale4": 900.0}, cached=True)
    assert math.isclose(run.shards4_over_1_p99, 35.0 / 20.0)
    lines = table(run).splitlines()
    assert lines[0].startswith("| shards (1,000,000 vectors, through the API) |")
    assert [label(n) for n in CONFIGS] == ["unsharded", "1 shard", "2 shards", "4 shards"]
    assert lines[2] == "| unsharded | 10 | 10.0 | 20.0 | 1.00 | 0 / 0 | 600 (cached) |"
    assert lines[4] == "| 2 shards | 10 | 12.0 | 30.0 | 1.50 | 0 / 0 | - (cached) |"
    assert lines[5].startswith("| 4 shards | 10 | 13.0 | 35.0 | 1.75 |")
