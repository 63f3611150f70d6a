"""Ctrl-C and SIGTERM for the CLI's process: the first stops the run cleanly, and nothing that
follows can leave it hanging.

- The first SIGINT raises ``KeyboardInterrupt`` and the first SIGTERM ``Terminated`` (the same
  path: the run saves a checkpoint, stops its processes and frees its shared memory).
- A second signal does not interrupt that clean-up halfway (an interrupted ``close`` is how a
  queue's feeder thread was left to hang exit); it ends the process at once, children first.
- ``deferred()`` marks a step that a signal must not cut in half, and raises the signal at its
  end: spawning a child, whose start-up message cut short leaves it to die with a traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM (preemption, ``kill``): handled exactly like Ctrl-C."""


_first: list[int] = []  # the signal that started the shutdown
_deferring = [0]  # depth of ``deferred`` blocks
_pending: list[int] = []  # a signal that arrived inside one


def exit_code(signum: int) -> int:
    return 128 + signum  # what a shell reports for a process that a signal ended


def _raise(signum: int) -> None:
    _first.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _first:
        if _deferring[0]:
            _pending[:] = [signum]
            return
        _raise(signum)
    print("impala_gpu: second signal: stopping at once.", file=sys.stderr, flush=True)
    for child in multiprocessing.active_children():
        child.kill()
    os._exit(exit_code(_first[0]))


def install() -> None:
    """Take SIGTERM, and SIGINT unless it was ignored at start (a background job's stays so)."""
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal inside the block is raised when it ends (only once ``install`` ran)."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        if not _deferring[0] and _pending:
            _raise(_pending.pop())
