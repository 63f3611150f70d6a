"""``scripts/setup.sh``'s optional tcmalloc step, run as a user runs it: in a terminal (a pty, by
``script``), with ``apt-get`` stubbed on PATH. It never waits on the terminal, and its one line
says what really happened: installed, failed (and apt's reason), timed out, or skipped and why.

Before: ``timeout 180 apt-get ...`` ran apt in a process group of its own, in the terminal's
background; apt touched the terminal, the kernel stopped it (state T) although the install took
2 s, and after 180 s the script said ``could not apt-get install`` (false)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = shutil.which("script")  # util-linux: runs a command in a pseudo-terminal

pytestmark = pytest.mark.skipif(SCRIPT is None, reason="needs util-linux's script (a pty)")

# apt-get as the terminal sees it: it reads its stdin (apt and dpkg touch the terminal), which
# in a background process group stops it (SIGTTIN) when stdin is the terminal.
APT_OK = """#!/bin/bash
if [ -t 0 ]; then echo tty > "$STUB_LOG"; else echo "not a tty" > "$STUB_LOG"; fi
read -r -t 60 _ || true
sleep 1
echo "Setting up libtcmalloc-minimal4"
"""
APT_FAILS = """#!/bin/bash
echo "E: Unable to locate package libtcmalloc-minimal4"
exit 100
"""
APT_HANGS = """#!/bin/bash
sleep 60
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_setup(
    tmp_path: Path, apt: str | None, uid: int = 0, **env: str
) -> tuple[str, float, Path]:
    """``bash scripts/setup.sh --only-apt`` in a pty, in a copy of the repo's layout whose
    ``.venv`` finds no tcmalloc. Returns its output, the seconds it took and the stub's log."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    (root / ".venv" / "bin").mkdir(parents=True)
    _executable(root / ".venv" / "bin" / "python", "#!/bin/sh\nexit 1\n")  # no tcmalloc yet
    # Only these tools on PATH (no real apt-get), plus the stubs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "mktemp", "timeout", "tail", "rm", "sleep", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    _executable(bin_dir / "id", f"#!/bin/sh\necho {uid}\n")
    if apt is not None:
        _executable(bin_dir / "apt-get", apt)
    stub_log = tmp_path / "stub.log"
    inherited = {k: v for k, v in os.environ.items() if k != "IMPALA_GPU_NO_APT"}
    env = {**inherited, "PATH": str(bin_dir), "STUB_LOG": str(stub_log), **env}
    bash = shutil.which("bash")
    cmd = f"{bash} {root}/scripts/setup.sh --only-apt"
    t0 = time.monotonic()
    proc = subprocess.run(
        [SCRIPT, "-qec", cmd, "/dev/null"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    took = time.monotonic() - t0
    out = proc.stdout.replace("\r\n", "\n")
    assert proc.returncode == 0, out
    return out, took, stub_log


def _line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("setup.sh:")]
    assert len(lines) == 1, out
    return lines[0]


def test_apt_in_a_terminal_does_not_wait_on_it(tmp_path):
    out, took, stub_log = _run_setup(tmp_path, APT_OK)
    assert took < 30, f"{took:.0f} s: apt waited on the terminal"
    assert stub_log.read_text().strip() == "not a tty"
    assert _line(out) == "setup.sh: installed libtcmalloc-minimal4 (tcmalloc: the CLI preloads it)"


def test_a_failed_install_says_why(tmp_path):
    out, _, _ = _run_setup(tmp_path, APT_FAILS)
    assert _line(out) == (
        "setup.sh: apt-get install libtcmalloc-minimal4 failed (exit 100; optional, skipped): "
        "E: Unable to locate package libtcmalloc-minimal4"
    )


def test_a_timed_out_install_says_it_timed_out(tmp_path):
    out, took, _ = _run_setup(tmp_path, APT_HANGS, IMPALA_GPU_APT_TIMEOUT_S="2")
    assert took < 30
    assert _line(out) == (
        "setup.sh: apt-get install libtcmalloc-minimal4 timed out after 2 s (optional; skipped)"
    )


@pytest.mark.parametrize(
    "apt,uid,env,why",
    [
        (APT_OK, 1000, {}, "not root; as root: apt-get install libtcmalloc-minimal4"),
        (None, 0, {}, "no apt-get here; install gperftools' tcmalloc with this system's"),
        (APT_OK, 0, {"IMPALA_GPU_NO_APT": "1"}, "IMPALA_GPU_NO_APT is set"),
    ],
    ids=["not-root", "no-apt", "opted-out"],
)
def test_a_skipped_install_says_why(tmp_path, apt, uid, env, why):
    out, _, stub_log = _run_setup(tmp_path, apt, uid, **env)
    assert _line(out).startswith(f"setup.sh: optional speed-up tcmalloc not installed ({why}")
    assert not stub_log.exists(), "apt-get ran"
