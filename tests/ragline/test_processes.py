"""The supervisor signals its children together, keeps the ``last`` (Redis) until the others are
gone, kills whole process groups after the grace, and programs that use it (the benchmarks,
``ragline up``) stop their children on SIGTERM, SIGINT or a ``timeout``. Real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from ragline import processes
from ragline.processes import Supervisor

# Each test waits out real signals and grace periods on a process tree.
pytestmark = pytest.mark.slow

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# A child that ignores SIGTERM and has a grandchild: only the group kill ends both.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
]


def _family(*children: processes.Child) -> list[psutil.Process]:
    procs = [psutil.Process(c.proc.pid) for c in children]
    return procs + [p for c in procs for p in c.children(recursive=True)]


def _wait_for_children(pid: int, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(psutil.Process(pid).children(recursive=True)) < n:
        assert time.monotonic() < deadline, "the grandchild never started"
        time.sleep(0.05)


def test_stop_signals_together_then_kills_whole_groups() -> None:
    sup = Supervisor(grace_s=1.0, last_grace_s=1.0)
    polite = sup.start("polite", SLEEP, {})
    stubborn = [sup.start(f"stubborn-{i}", STUBBORN, {}) for i in range(3)]
    for child in stubborn:
        _wait_for_children(child.proc.pid, 1)
    family = _family(polite, *stubborn)
    assert len(family) == 7
    assert sup.exited() is None

    took = sup.stop()
    # One grace for all three stubborn children, not one each.
    assert 1.0 <= took < 2.5, took
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive
    assert sup.children == []


def test_a_niced_child_is_niced_against_the_other_sessions_too() -> None:
    """Each child leads a session of its own, and where the kernel schedules by autogroup the
    CPU is shared between sessions first: the nice value goes to the child's session as well."""
    sup = Supervisor(grace_s=1.0)
    child = sup.start("niced", SLEEP, {}, nice=7)
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.proc.pid) == 7
        autogroup = Path(f"/proc/{child.proc.pid}/autogroup")
        if autogroup.exists():  # a kernel with autogroup scheduling
            assert autogroup.read_text().split()[-1] == "7", autogroup.read_text()
    finally:
        sup.stop()


def test_last_outlives_the_others_and_stops_after_them(tmp_path: Path) -> None:
    """A child that drains for a while on SIGTERM finds the `last` one (Redis) still running."""
    sup = Supervisor(grace_s=5.0, last_grace_s=2.0)
    redis_like = sup.start("redis", SLEEP, {}, last=True)
    seen = tmp_path / "seen"
    drainer = textwrap.dedent(
        f"""
        import os, signal, sys, time
        def drain(*_):
            time.sleep(0.5)
            try:
                os.kill({redis_like.proc.pid}, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            open({str(seen)!r}, "w").write(str(alive))
            sys.exit(0)
        signal.signal(signal.SIGTERM, drain)
        open({str(seen)!r} + ".ready", "w").close()
        time.sleep(60)
        """
    )
    sup.start("worker", [sys.executable, "-c", drainer], {})
    deadline = time.monotonic() + 10
    while not Path(f"{seen}.ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)

    took = sup.stop()
    assert seen.read_text() == "True"
    assert redis_like.proc.returncode == -signal.SIGTERM  # stopped by its signal, not killed
    assert took < 2.0, took  # no grace spent once everyone had exited


def test_what_an_exited_child_leaves_in_its_group_gets_sigterm_not_the_whole_grace() -> None:
    """A worker that dies on SIGTERM without stopping its engine core: the orphan is told to
    stop as soon as its parent is gone, well before the grace ends."""
    orphaning = [
        sys.executable,
        "-c",
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
    ]
    sup = Supervisor(grace_s=30.0)
    child = sup.start("worker", orphaning, {})
    _wait_for_children(child.proc.pid, 1)
    family = _family(child)
    took = sup.stop()
    assert took < 5.0, took
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive


def test_stop_by_name_leaves_the_others_running() -> None:
    sup = Supervisor(grace_s=1.0)
    api = sup.start("api", SLEEP, {})
    worker = sup.start("worker", SLEEP, {})
    try:
        sup.stop("api")
        assert api.proc.poll() is not None
        assert worker.proc.poll() is None
        assert [c.name for c in sup.children] == ["worker"]
    finally:
        sup.stop()
    assert worker.proc.poll() is not None


def test_a_second_signal_during_stop_cuts_the_grace_short() -> None:
    """A second Ctrl-C/SIGTERM while stopping kills at once; it raises nothing mid-stop."""
    before = signal.getsignal(signal.SIGTERM)
    sup = Supervisor(grace_s=30.0)
    child = sup.start("stubborn", STUBBORN, {})
    _wait_for_children(child.proc.pid, 1)
    family = _family(child)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    took = sup.stop()
    assert took < 5.0, took
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def test_a_signal_while_starting_arrives_once_the_child_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM between fork and the bookkeeping must not leave an unrecorded child running."""
    real_popen = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    before = signal.getsignal(signal.SIGTERM)
    processes.interrupt_on_signals()
    sup = Supervisor(grace_s=1.0)
    try:
        monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
        with pytest.raises(KeyboardInterrupt):
            sup.start("sleeper", SLEEP, {})
        monkeypatch.undo()
        assert [c.name for c in sup.children] == ["sleeper"]
    finally:
        sup.stop()
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


# A program that starts children as the benchmarks do: a stubborn one with a grandchild, and
# one more, then waits; it never stops them itself unless a signal unwinds it.
PROGRAM = textwrap.dedent(
    """
    import sys, time
    from ragline import processes
    processes.interrupt_on_signals()
    sup = processes.Supervisor(grace_s=1.0)
    sup.start("stubborn", {stubborn!r}, {{}})
    sup.start("sleeper", {sleep!r}, {{}})
    print("started", flush=True)
    {body}
    """
)


def _program(body: str) -> list[str]:
    return [sys.executable, "-c", PROGRAM.format(stubborn=STUBBORN, sleep=SLEEP, body=body)]


def _started(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    _wait_for_children(proc.pid, 3)
    return psutil.Process(proc.pid).children(recursive=True)


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name
)
def test_a_signalled_program_stops_its_children(signum: int) -> None:
    # `with sup:` in one case, nothing at all in the other: then the atexit hook stops them.
    for body in ("with sup:\n        time.sleep(60)", "time.sleep(60)"):
        proc = subprocess.Popen(_program(body), stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
        family = _started(proc)
        started = time.monotonic()
        proc.send_signal(signum)
        proc.wait(15)
        _gone, alive = psutil.wait_procs(family, timeout=5)
        assert not alive, (body, [p.cmdline() for p in alive])
        # The promise is 15 s (a 1 s grace, then the kills); a loaded CI box can take seconds to
        # schedule the kills, so the bound is the promise, not the grace.
        assert time.monotonic() - started < 15, body


def test_a_program_under_timeout_stops_its_children() -> None:
    """`timeout` sends SIGTERM when the time is up: a benchmark stopped that way leaves nothing."""
    proc = subprocess.Popen(
        ["timeout", "5", *_program("time.sleep(60)")], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    family = _started(proc)
    assert proc.wait(15) == 124
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive, [p.cmdline() for p in alive]


def test_sigint_stops_a_program_started_with_it_ignored() -> None:
    """A shell without job control starts ``ragline up &`` with SIGINT ignored; Ctrl-C's signal,
    sent by hand, still stops it and its children."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        _program("with sup:\n        time.sleep(60)"),
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path.cwd(),
        preexec_fn=ignore_sigint,
    )
    family = _started(proc)
    proc.send_signal(signal.SIGINT)
    proc.wait(15)
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive, [p.cmdline() for p in alive]
