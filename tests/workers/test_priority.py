"""A worker's lowered priority: its own nice value, and its session's autogroup when it leads the
session (a narrow fake of the /proc file and of the session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ragline.workers import priority

pytestmark = pytest.mark.unit


@pytest.fixture
def niced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(priority.os, "nice", lambda n: calls.append(n) or n)
    return calls


def test_a_session_leader_lowers_its_autogroup_too(
    tmp_path: Path, niced: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid())
    priority.lower_priority(10, autogroup=autogroup)
    assert niced == [10] and autogroup.read_text() == "10\n"


def test_a_process_in_anothers_session_leaves_the_session_as_it_is(
    tmp_path: Path, niced: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid() + 1)
    priority.lower_priority(10, autogroup=autogroup)
    assert niced == [10] and autogroup.read_text() == "/autogroup-7 nice 0\n"


def test_no_autogroup_on_this_kernel_is_no_error(niced: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid())
    priority.lower_priority(5, autogroup=Path("/nonexistent/autogroup"))
    assert niced == [5]


def test_niceness_zero_changes_nothing(tmp_path: Path, niced: list[int]) -> None:
    autogroup = tmp_path / "autogroup"
    priority.lower_priority(0, autogroup=autogroup)
    assert niced == [] and not autogroup.exists()


def test_a_session_leader_sets_its_sessions_nice_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the supervisor gives a child started with an absolute nice value."""
    autogroup = tmp_path / "autogroup"
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid())
    priority.set_session_nice(5, autogroup=autogroup)
    assert autogroup.read_text() == "5\n"
