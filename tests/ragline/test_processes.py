"""The supervisor stops children in reverse order and leaves no process of their groups behind."""

from __future__ import annotations

import signal
import sys
import time

import psutil

from ragline.processes import Supervisor

# A child that ignores SIGTERM and has a grandchild: only the group kill ends both.
STUBBORN = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
)


def test_stop_kills_whole_groups_after_grace() -> None:
    sup = Supervisor(grace_s=0.5)
    polite = sup.start("polite", [sys.executable, "-c", "import time; time.sleep(60)"], {})
    stubborn = sup.start("stubborn", [sys.executable, "-c", STUBBORN], {}, stop_signal=signal.SIGTERM)
    time.sleep(0.5)
    family = [psutil.Process(polite.proc.pid), psutil.Process(stubborn.proc.pid)]
    family += psutil.Process(stubborn.proc.pid).children(recursive=True)
    assert len(family) == 3
    assert sup.exited() is None
    sup.stop()
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive
    assert sup.children == []
