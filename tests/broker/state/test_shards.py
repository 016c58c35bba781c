"""Shard names, routing by the shard field, worker selections and the logical index's version."""

from __future__ import annotations

import pytest
from ragline.broker.contract.messages import Done, PrefixMatch, ShardReply, Sources
from ragline.broker.contract.queues import RETRIEVAL_QUEUE
from ragline.broker.contract.records import IndexInfo
from ragline.broker.state import shards
from ragline.broker.state.indexes import InvalidIndexName, valid_index_name

YEARS = shards.ShardMap(index="news", shard_by="year", keys=("2022", "2023", "2024"))
HASHED = shards.ShardMap(index="docs", shard_by=None, keys=("0", "1", "2"))


def test_shard_names_keep_the_index_name_rule() -> None:
    assert shards.shard_index("docs", "0") == "docs.shard-0"
    assert shards.shard_index("news", "eu-west_2") == "news.shard-eu-west_2"
    assert all(valid_index_name(s) for s in (*YEARS.shards, *HASHED.shards))
    assert shards.split_shard("news.shard-2024") == ("news", "2024")
    assert shards.split_shard("news") is None


@pytest.mark.parametrize("key", ["../x", "a/b", "", "é", "x" * 60, "a b"])
def test_a_shard_key_that_would_break_the_rule_is_refused(key: str) -> None:
    with pytest.raises(InvalidIndexName):
        shards.shard_index("docs", key)


@pytest.mark.parametrize("name", ["docs.shard-0", "a.shard-x", "..", "a/b", "x" * 65])
def test_a_logical_name_may_not_be_a_shards_or_break_the_rule(name: str) -> None:
    with pytest.raises(InvalidIndexName):
        shards.check_logical_name(name)


def test_a_filter_on_the_shard_field_routes_to_matching_shards_only() -> None:
    assert YEARS.route(None) == YEARS.shards
    assert YEARS.route({"region": "eu"}) == YEARS.shards
    assert YEARS.route({"year": "2023"}) == ("news.shard-2023",)
    assert YEARS.route({"year": ["2022", "2024", "1999"]}) == ("news.shard-2022", "news.shard-2024")
    assert YEARS.route({"year": PrefixMatch(prefix="202")}) == YEARS.shards
    assert YEARS.route({"year": "1999"}) == ()
    # Sharded by hash, no filter can narrow it.
    assert HASHED.route({"year": "2023"}) == HASHED.shards


def test_hash_shards_are_stable_and_spread() -> None:
    placed = [shards.hash_shard(f"doc-{i}.md", 3) for i in range(300)]
    assert placed == [shards.hash_shard(f"doc-{i}.md", 3) for i in range(300)]
    assert all(placed.count(k) > 60 for k in ("0", "1", "2"))


def test_worker_selections() -> None:
    maps = [YEARS, HASHED]
    assert shards.parse_selection("all") is None
    assert shards.parse_selection("none") == frozenset()
    chosen = shards.parse_selection("news:2024, docs:0")
    assert chosen == {"news.shard-2024", "docs.shard-0"}
    # Every shard, and batches; batches only; only the shards named, without batches.
    assert shards.worker_queues(maps, None) == [RETRIEVAL_QUEUE] + [
        shards.shard_queue(s) for s in (*YEARS.shards, *HASHED.shards)
    ]
    assert shards.worker_queues(maps, frozenset()) == [RETRIEVAL_QUEUE]
    assert shards.worker_queues(maps, chosen) == ["retrieval.docs.shard-0", "retrieval.news.shard-2024"]
    for bad in ("news", "news:", "news:a/b", "x.shard-1:0"):
        with pytest.raises(InvalidIndexName):
            shards.parse_selection(bad)


def _info(name: str, version: str) -> IndexInfo:
    return IndexInfo(name=name, version=version, path="/x", chunks=10, dim=384, documents=2, bytes=100)


def test_the_logical_version_changes_with_any_shards() -> None:
    before = shards.logical_info(HASHED, [_info(s, "v1") for s in HASHED.shards], path="/i/docs")
    after = shards.logical_info(
        HASHED,
        [_info("docs.shard-0", "v1"), _info("docs.shard-1", "v2"), _info("docs.shard-2", "v1")],
        path="/i/docs",
    )
    assert before.index_type == shards.SHARDED_TYPE and before.chunks == 30 and before.documents == 6
    assert before.version != after.version
    assert shards.ShardMap.decode(YEARS.encode()) == YEARS


def test_a_hash_map_keeps_its_count_and_the_rerun_hint_names_it() -> None:
    counted = shards.ShardMap(index="docs", shard_by=None, keys=("0", "2"), count=5)
    assert shards.ShardMap.decode(counted.encode()) == counted
    # A map written before the count was kept decodes without it.
    assert shards.ShardMap.decode('{"index": "docs", "shard_by": null, "keys": ["0", "1"]}').count is None
    assert shards.rerun_hint(counted) == "--index docs --shards 5"
    assert shards.rerun_hint(HASHED) == "--index docs --shards N"  # no count recorded
    assert shards.rerun_hint(YEARS) == "--index news --shard-by year"


def test_partial_fields_reach_every_answer() -> None:
    done = Done(answer=None, partial=True, partial_shards=["docs.shard-2"])
    assert Done.decode(done.encode()) == done
    sources = Sources(sources=[], partial=True, partial_shards=["docs.shard-2"])
    assert Sources.decode(sources.encode()).partial_shards == ["docs.shard-2"]
    assert ShardReply.decode(ShardReply(search_id="s", shard="docs.shard-0").encode()).hits == []


def test_shards_past_the_limit_are_refused_naming_it() -> None:
    # Keys the index holds already count once; only new ones can pass the limit.
    shards.check_shard_count("news", YEARS.keys, ["2022", "2024"], limit=3)
    shards.check_shard_count("news", YEARS.keys, ["2025"], limit=4)
    with pytest.raises(shards.TooManyShards) as refused:
        shards.check_shard_count("news", YEARS.keys, ["2024", "2025", "2026"], limit=4)
    message = str(refused.value)
    assert "'news' would have 5 shards" in message and "'2025', '2026'" in message
    assert "the limit is 4 (RAGLINE_MAX_SHARDS_PER_INDEX)" in message
    with pytest.raises(shards.TooManyShards):
        shards.check_shard_count("docs", (), map(str, range(65)), limit=64)
