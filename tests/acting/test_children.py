"""``actor_pids``: a run's spawned children, by parent pid, from /proc."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from impala_gpu.acting.children import actor_pids

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads Linux's /proc")


def test_spawned_children_are_listed_and_other_children_are_not() -> None:
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(30,))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child.start()
    try:
        deadline = time.monotonic() + 30
        while child.pid not in actor_pids(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = actor_pids(os.getpid())
        assert child.pid in pids  # started by spawn: spawn_main on its command line
        assert other.pid not in pids  # a child, but not a spawned one
        assert actor_pids(other.pid) == []
    finally:
        child.terminate()
        other.terminate()
        child.join(10)
        other.wait(10)
    assert child.pid not in actor_pids(os.getpid())
