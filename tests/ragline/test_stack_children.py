"""`ragline up` stops when a child it needs exits, and goes on when a survivable one does (a node of
its Sentinel set: the set fails over)."""

from __future__ import annotations

import os
import sys

import pytest
from ragline.broker.config.settings import Settings

from ragline.processes import Supervisor
from ragline.stack import Stack

EXIT_AT_ONCE = [sys.executable, "-c", "pass"]


def _exited(stack: Stack, name: str) -> None:
    child = next(c for c in stack.supervisor.children if c.name == name)
    child.proc.wait(30)


def test_a_survivable_childs_end_is_logged_and_the_stack_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with Supervisor() as sup:
        sup.start("redis-6380", EXIT_AT_ONCE, dict(os.environ), survivable=True)
        stack = Stack(Settings(), sup)
        _exited(stack, "redis-6380")
        stack.check_children()
        stack.check_children()  # said once
    assert [r.getMessage() for r in caplog.records if "redis-6380" in r.getMessage()] == [
        "redis-6380 exited with status 0; the rest go on"
    ]


def test_a_needed_childs_end_stops_the_stack() -> None:
    with Supervisor() as sup:
        sup.start("api", EXIT_AT_ONCE, dict(os.environ))
        stack = Stack(Settings(), sup)
        _exited(stack, "api")
        with pytest.raises(RuntimeError, match="api exited with status 0"):
            stack.check_children()
