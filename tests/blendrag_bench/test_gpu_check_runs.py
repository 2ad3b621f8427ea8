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


def _check(out: Path, phase: str, *argv: str, caps: dict[str, int] | None = None,
           after: str = "") -> subprocess.Popen:
    """The check in a process of its own, every phase's command replaced by ``phase`` (its
    name in argv[1]), ``caps``: phases' time limits; ``after``: run once the check returns."""
    script = ("import sys\nfrom blendrag_bench.gpu import check\n"
              f"check.phase_command = lambda name, args: [sys.executable, '-c', {phase!r}, name]\n"
              f"for name, cap in {caps or {}!r}.items():\n"
              "    check.PHASES[name] = (check.PHASES[name][0], cap)\n"
              f"code = check.main(['--out', {str(out)!r}, *{list(argv)!r}])\n{after}\n"
              "sys.exit(code)")
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=out)


def _line(check: subprocess.Popen, start: str) -> str:
    """The check's next line of output that starts with ``start`` (a phase prints too)."""
    assert check.stdout is not None
    while line := check.stdout.readline():
        if line.startswith(start):
            return line
    raise AssertionError(f"the check ended without a line {start!r}")


def _phase_pid(check: subprocess.Popen) -> int:
    line = _line(check, "[gpu-check]")  # "[gpu-check] chat (at most 120 s, pid N)"
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


# a phase that writes a figure into its file (as the phases' Figures do), then runs on
FIGURE_THEN_SLEEP = (
    "import sys, time\n"
    "from blendrag_bench.gpu.check import PHASES\n"
    "from blendrag_bench.gpu.summary import Figures\n"
    "name = sys.argv[1]\n"
    "f = open(PHASES[name][0], 'a')\n"
    "emit = lambda line: (f.write(line + '\\n'), f.flush())\n"
    "Figures(name, emit)[name + ' speed-up'] = (12.5, '>= 10x', True)\n"
    "print('figure written', flush=True)\n"
    "time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 120)\n")


@pytest.mark.processes
def test_a_phase_stopped_at_its_time_limit_keeps_the_figures_it_measured(tmp_path):
    """The check's own process imports no torch (no CUDA context beside the phases', nothing
    to wait for once the last phase is stopped)."""
    check = _check(tmp_path, FIGURE_THEN_SLEEP, "--only", "chat", "--budget", "300",
                   caps={"chat": 3},
                   after="print('parent imported torch' if 'torch' in sys.modules else "
                         "'parent without torch')")
    out, _ = check.communicate(timeout=60)
    assert check.returncode == 0, out
    assert "parent without torch" in out
    summary = (tmp_path / "summary.md").read_text()
    assert "| chat | stopped after 3 s (partial output kept)" in summary, summary
    assert "| chat speed-up | 12.50x | >= 10x | PASS |" in summary, summary


@pytest.mark.processes
def test_the_summary_is_written_after_every_phase(tmp_path):
    """A check killed outright while its second phase runs leaves a summary with the first
    phase's figures and the second named as the one running."""
    quick = FIGURE_THEN_SLEEP.replace("float(sys.argv[2]) if len(sys.argv) > 2 else 120",
                                      "0 if sys.argv[1] == 'chat' else 120")
    check = _check(tmp_path, quick, "--only", "chat", "decode", "--budget", "300")
    _phase_pid(check)  # chat
    assert "chat: ok" in _line(check, "[gpu-check] chat:")
    pid = _phase_pid(check)  # decode, running
    try:
        check.kill()
        check.wait(timeout=30)
        assert _gone(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    summary = (tmp_path / "summary.md").read_text()
    assert "| chat | ok," in summary and "| chat speed-up | 12.50x | >= 10x | PASS |" in summary
    assert "| decode | running (the check was stopped) |" in summary, summary


@pytest.mark.processes
def test_no_phase_starts_in_the_budget_kept_for_the_summary(tmp_path):
    """A phase is started with at least MIN_PHASE_S left after the RESERVE_S kept for the
    summary (15 s did not even build the 7B-shaped model)."""
    from blendrag_bench.gpu.check import MIN_PHASE_S, RESERVE_S

    assert MIN_PHASE_S >= 30 and RESERVE_S >= 20
    check = _check(tmp_path, "print('phase ran')", "--only", "chat", "--budget",
                   str(MIN_PHASE_S + RESERVE_S - 1))
    out, _ = check.communicate(timeout=60)
    assert "phase ran" not in out and "pid" not in out
    assert "| chat | not run: out of time |" in (tmp_path / "summary.md").read_text()


def test_figures_are_read_back_per_phase_from_their_files(tmp_path):
    """Two phases in one file each keep theirs; the last value of a figure wins; a line cut
    short (a phase killed as it wrote) is passed over."""
    from blendrag_bench.gpu.summary import Figures, read_figures

    path = tmp_path / "decode.txt"
    with path.open("a") as f:
        def emit(line: str) -> None:
            f.write(line + "\n")

        decode, serve = Figures("decode", emit), Figures("serve", emit)
        decode["a"] = (1.0, "", None)
        emit("a table line")
        serve["a"] = ("8/8", "all", True)
        decode["a"] = (2.0, ">= 1x", True)
        decode.update({"b": (3.0, "", None)})
        f.write('[figure] {"phase": "decode", "figure": "c", "va')
    assert read_figures([path, path]) == {"decode": {"a": (2.0, ">= 1x", True),
                                                     "b": (3.0, "", None)},
                                          "serve": {"a": ("8/8", "all", True)}}


def test_a_phase_that_raises_writes_its_traceback_into_its_file(tmp_path, monkeypatch):
    """A GPU run keeps a phase's file whole but its stderr cut to the tail: the traceback goes
    into the file, after what the phase wrote and the figures it had; the phase exits 1."""
    from blendrag_bench.gpu import check, cold

    def boom(emit, small, out):
        emit("model built ...")
        out["cold start: warm-up s"] = (1.5, "", None)
        raise AttributeError("'KVSlab' object has no attribute 'claimx'")

    monkeypatch.setattr(cold, "run", boom)
    assert check._phase("cold", tmp_path, True) == 1
    text = (tmp_path / "ttft-3k.txt").read_text()
    assert text.startswith("# cold: ")
    assert "model built ...\n[figure] " in text
    assert "[error] phase cold raised:\nTraceback (most recent call last):" in text
    assert "in boom\n" in text
    assert text.rstrip().endswith("AttributeError: 'KVSlab' object has no attribute 'claimx'")
