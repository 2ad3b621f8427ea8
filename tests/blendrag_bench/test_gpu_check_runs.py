"""How the GPU check runs its phases: each in a process of its own, stopped with the check
however the check is stopped, within the budget, whatever a phase does (here stood in for by
small commands: no torch in these processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLEEPER = "import time; print('phase up', flush=True); time.sleep(120)"


def _check(out: Path, phase: str, *argv: str) -> subprocess.Popen:
    """The check in a process of its own, every phase's command replaced by ``phase``."""
    script = ("import sys\nfrom blendrag_bench.gpu import check\n"
              f"check.phase_command = lambda *a: [sys.executable, '-c', {phase!r}]\n"
              f"sys.exit(check.main(['--out', {str(out)!r}, *{list(argv)!r}]))")
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def _phase_pid(check: subprocess.Popen) -> int:
    assert check.stdout is not None
    line = check.stdout.readline()  # "[gpu-check] chat (at most 120 s, pid N)"
    assert "pid" in line, line
    return int(line.rsplit("pid ", 1)[1].rstrip(")\n"))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.processes
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_check_stopped_from_outside_stops_its_running_phase(tmp_path, signum):
    """A time limit's SIGTERM (or Ctrl-C) to the check: the phase it runs, in a session of its
    own, is stopped too (it would hold the GPU on), and the summary says so."""
    check = _check(tmp_path, SLEEPER, "--only", "chat", "--budget", "300")
    pid = _phase_pid(check)
    try:
        time.sleep(0.3)
        os.kill(check.pid, signum)
        assert check.wait(timeout=30) == 128 + signum
        assert _gone(pid), "the phase outlived the check"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    summary = (tmp_path / "summary.md").read_text()
    assert f"| chat | stopped: the check got {signal.Signals(signum).name}" in summary


@pytest.mark.processes
def test_a_check_killed_outright_takes_its_phase_with_it(tmp_path):
    """SIGKILL, which no handler sees: the phase dies with its parent (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    check = _check(tmp_path, SLEEPER, "--only", "chat", "--budget", "300")
    pid = _phase_pid(check)
    try:
        time.sleep(0.3)
        check.kill()
        check.wait(timeout=30)
        assert _gone(pid), "the phase outlived the check"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
