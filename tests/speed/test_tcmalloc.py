"""The CLI's restart under tcmalloc: the library preloaded, the command line kept; no restart
when it is turned off, already loaded or missing."""

from __future__ import annotations

import sys

import pytest

from impala_gpu.speed import tcmalloc


def fake_exec(calls):
    def execve(path, argv, env):
        calls.append((path, argv, env))

    return execve


def test_reexec_preloads_tcmalloc_and_keeps_the_command_line(monkeypatch):
    monkeypatch.delenv(tcmalloc.TCMALLOC_ENV, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    monkeypatch.setattr(tcmalloc, "find_tcmalloc", lambda: "/x/libtcmalloc_minimal.so.4")
    calls = []
    argv = ["python", "-m", "impala_gpu", "env=cartpole"]
    tcmalloc.reexec_with_tcmalloc(argv, execve=fake_exec(calls))
    [(path, new_argv, env)] = calls
    assert path == sys.executable
    assert new_argv == [sys.executable, "-m", "impala_gpu", "env=cartpole"]
    assert env["LD_PRELOAD"] == "/x/libtcmalloc_minimal.so.4:/opt/other.so"


@pytest.mark.parametrize("case", ["disabled", "already", "missing"])
def test_no_reexec(monkeypatch, case):
    monkeypatch.setattr(tcmalloc, "find_tcmalloc", lambda: None if case == "missing" else "/x/t.so")
    monkeypatch.delenv(tcmalloc.TCMALLOC_ENV, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    if case == "disabled":
        monkeypatch.setenv(tcmalloc.TCMALLOC_ENV, "0")
    if case == "already":
        monkeypatch.setenv("LD_PRELOAD", "/x/libtcmalloc_minimal.so.4")
    calls = []
    tcmalloc.reexec_with_tcmalloc(["python", "-m", "impala_gpu"], execve=fake_exec(calls))
    assert calls == []
