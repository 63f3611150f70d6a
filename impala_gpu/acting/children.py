"""A run's actor processes as the OS lists them, for the fault-injection tests and the faults
benchmark, which kill one and watch the pool replace it."""

from __future__ import annotations

import os


def actor_pids(parent: int) -> list[int]:
    """The live actor processes of the run whose main process is ``parent``: its children
    started by multiprocessing's spawn (``spawn_main`` on their command line; the resource
    tracker is a child too, and is left out). From Linux's ``/proc``; empty elsewhere."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for pid in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{pid}/stat") as f:
                # The command name in parentheses may hold spaces: the parent pid is the
                # second field after its closing parenthesis.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue  # gone since the listing, or not ours to read
        if ppid == parent and b"spawn_main" in cmd:
            pids.append(int(pid))
    return sorted(pids)
