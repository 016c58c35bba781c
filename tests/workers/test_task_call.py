"""How a task's hooks run around its body: before in order, after in reverse whatever happened,
each after seeing (and able to replace) the error so far. Narrow fakes: hooks that record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

import pytest
from ragline.workers.task_call import Hook, Skip, TaskCall, passes_through, run


@dataclass(frozen=True)
class Note:
    text: str

    @classmethod
    def decode(cls, kwargs: Any) -> Self:
        return cls(**kwargs)


@dataclass
class Recorder(Hook[Note]):
    name: str
    log: list[str]
    skip: bool = False
    swallow: bool = False
    replace_with: BaseException | None = None
    raise_in_after: BaseException | None = None
    seen: list[BaseException | None] = field(default_factory=list)

    def before(self, call: TaskCall[Note]) -> None:
        self.log.append(f"before {self.name}")
        if self.skip:
            raise Skip("told to")

    def after(self, call: TaskCall[Note], error: BaseException | None) -> BaseException | None:
        self.log.append(f"after {self.name}")
        self.seen.append(error)
        if self.raise_in_after is not None:
            raise self.raise_in_after
        if self.swallow:
            return None
        return self.replace_with or error


def _call() -> TaskCall[Note]:
    call: TaskCall[Note] = TaskCall("test.task", {"text": "hi"}, task_id="t1")
    call.payload = Note("hi")
    return call


def test_before_in_order_then_the_body_then_after_in_reverse() -> None:
    log: list[str] = []
    hooks = [Recorder("a", log), Recorder("b", log)]
    run(_call(), hooks, lambda call: log.append(f"body {call.payload.text}"))
    assert log == ["before a", "before b", "body hi", "after b", "after a"]


def test_a_skip_ends_the_task_and_only_the_hooks_entered_get_their_after() -> None:
    log: list[str] = []
    a, b, c = Recorder("a", log), Recorder("b", log, skip=True), Recorder("c", log)
    run(_call(), [a, b, c], lambda call: log.append("body"))
    assert log == ["before a", "before b", "after a"]
    assert a.seen == [None]


def test_a_skip_from_the_body_is_no_error() -> None:
    log: list[str] = []
    a = Recorder("a", log)

    def body(call: TaskCall[Note]) -> None:
        raise Skip("nothing to do")

    run(_call(), [a], body)
    assert a.seen == [None]


def test_each_after_sees_the_error_so_far_and_may_deal_with_it() -> None:
    log: list[str] = []
    outer, inner = Recorder("outer", log), Recorder("inner", log, swallow=True)

    def body(call: TaskCall[Note]) -> None:
        raise ValueError("boom")

    run(_call(), [outer, inner], body)  # dealt with: nothing raised
    assert isinstance(inner.seen[0], ValueError) and outer.seen == [None]


def test_an_after_may_turn_the_error_into_another() -> None:
    log: list[str] = []
    replaced = RuntimeError("instead")
    outer, inner = Recorder("outer", log), Recorder("inner", log, replace_with=replaced)

    def body(call: TaskCall[Note]) -> None:
        raise ValueError("boom")

    with pytest.raises(RuntimeError, match="instead"):
        run(_call(), [outer, inner], body)
    assert outer.seen == [replaced]


def test_an_after_that_raises_still_lets_the_earlier_hooks_run() -> None:
    log: list[str] = []
    failing = OSError("redis away")
    outer, inner = Recorder("outer", log), Recorder("inner", log, raise_in_after=failing)

    def body(call: TaskCall[Note]) -> None:
        raise ValueError("boom")

    with pytest.raises(OSError, match="redis away") as raised:
        run(_call(), [outer, inner], body)
    assert outer.seen == [failing]
    assert isinstance(raised.value.__context__, ValueError)  # what it happened during


def test_an_error_in_a_before_reaches_the_hooks_entered_before_it() -> None:
    log: list[str] = []

    class Broken(Hook[Note]):
        def before(self, call: TaskCall[Note]) -> None:
            raise ConnectionError("no redis")

    a = Recorder("a", log)
    with pytest.raises(ConnectionError):
        run(_call(), [a, Broken()], lambda call: log.append("body"))
    assert log == ["before a", "after a"] and isinstance(a.seen[0], ConnectionError)


def test_the_payload_is_read_only_once_decoded() -> None:
    call: TaskCall[Note] = TaskCall("test.task", {"text": "hi"})
    with pytest.raises(RuntimeError, match="before it was decoded"):
        _ = call.payload
    assert call.task_id is None and not call.redelivered and call.picked_at > 0


def test_celerys_own_exceptions_and_non_exceptions_pass_through() -> None:
    from celery.exceptions import Ignore, Reject, Retry

    for error in (None, Reject("x", requeue=True), Retry(), Ignore(), KeyboardInterrupt()):
        assert passes_through(error), error
    assert not passes_through(ValueError("a failure"))
