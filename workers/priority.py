"""Lowering a worker's CPU priority below the other processes of its host.

nice(2) alone does not do it where the kernel schedules by autogroup (Linux with
``kernel.sched_autogroup_enabled``, the default of many kernels): the CPU is first shared between
sessions, and a process's nice value only orders it within its own session. Each process
``ragline up`` starts leads a session of its own, so a niced ingest worker still took a full
share against the retrieval worker, and the queries beside an upload waited for it. The
session's nice value (``/proc/self/autogroup``) is what orders it against the others. It is set
only when this process leads its session: a worker started from a terminal shares the
terminal's session, whose other programs it must not slow down.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(niceness: int, *, autogroup: Path = AUTOGROUP) -> None:
    """``niceness`` below the other processes (nice(2) increments, 0..19), for this process and,
    when it leads its session, for the session's autogroup; where neither can be set (another
    kernel, a container that forbids it) the process keeps its priority."""
    if niceness <= 0:
        return
    with contextlib.suppress(OSError):
        os.nice(niceness)
    set_session_nice(niceness, autogroup=autogroup)


def set_session_nice(nice: int, *, autogroup: Path = AUTOGROUP) -> None:
    """The autogroup's nice value (-20..19, absolute) of the session this process leads; nothing
    when it leads none, or where the kernel has no autogroup or forbids the value."""
    if os.getsid(0) != os.getpid():
        return
    with contextlib.suppress(OSError):
        autogroup.write_text(f"{nice}\n")
