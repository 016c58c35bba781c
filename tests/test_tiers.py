"""The tiers' rules (tests/tiers.py): what a test's fixtures make it, the contradictions refused,
and what a unit test is kept from while it runs (this file's tests are unit tests)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import redis
from ragline.broker.config.settings import Settings

from tests import tiers
from tests.conftest import TEST_REDIS_URL


@dataclass
class _Mark:
    name: str


@dataclass
class _Item:
    """What classify reads of a collected test."""

    fixturenames: list[str]
    marks: list[str] = field(default_factory=list)
    nodeid: str = "tests/x.py::test_x"

    def iter_markers(self) -> list[_Mark]:
        return [_Mark(m) for m in self.marks]


def _classify(fixturenames: list[str], marks: tuple[str, ...] = ()) -> set[str]:
    return tiers.classify(_Item(fixturenames, list(marks)))  # type: ignore[arg-type]  # the fields it reads


@pytest.mark.parametrize(
    ("fixturenames", "expected"),
    [
        (["tmp_path", "monkeypatch"], {"unit"}),
        (["settings", "redis_url", "home"], {"redis", "integration"}),  # settings asks for redis_url
        (["tokenizer", "prepared_model", "settings", "redis_url"], {"model", "redis", "integration"}),
        (["client", "api", "settings", "redis_url"], {"stack", "redis", "integration"}),
        (
            ["workers", "prepared_model", "embedder", "redis_url"],
            {"stack", "vllm", "model", "redis", "integration"},
        ),
    ],
)
def test_a_tests_tiers_follow_from_its_fixture_closure(fixturenames: list[str], expected: set[str]) -> None:
    assert _classify(fixturenames) == expected


def test_marks_by_hand_add_what_fixtures_cannot_show() -> None:
    assert _classify(["tmp_path"], ("redis",)) == {"integration"}  # redis is there already
    assert _classify([], ("slow",)) == set()  # slow alone: no integration
    assert _classify(["redis_url"], ("slow",)) == {"redis", "integration"}


def test_contradictions_are_refused_at_collection() -> None:
    with pytest.raises(pytest.UsageError, match="marked unit but uses redis_url"):
        _classify(["settings", "redis_url"], ("unit",))
    with pytest.raises(pytest.UsageError, match="nothing says what it needs"):
        _classify(["tmp_path"], ("integration",))
    assert _classify(["tmp_path"], ("unit",)) == set()  # unit by hand where it is unit: nothing to add


def test_a_unit_test_reaches_no_redis() -> None:
    for url in (TEST_REDIS_URL, Settings().redis.redis_url):
        with pytest.raises(redis.ConnectionError, match="unit test reached for Redis"):
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_a_unit_test_starts_no_redis_server_or_worker() -> None:
    for argv in (["redis-server", "--port", "0"], [sys.executable, "-m", "ragline", "worker", "retrieval"]):
        with pytest.raises(pytest.fail.Exception, match="a unit test started"):
            subprocess.Popen(argv)
    # Asking a binary its version starts nothing.
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True)
    assert "v=" in version.stdout
