"""Run ``helpers.store_worker`` commands in child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"


def _env() -> dict[str, str]:
    """The environment of a child: this checkout's sources and the test helpers importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), str(TESTS),
                                                    env.get("PYTHONPATH", "")) if p)
    return env


def start(command: str, args: dict, drop_dac_override: bool = False) -> subprocess.Popen:
    """Start a worker; ``drop_dac_override`` makes a root worker obey file permission bits."""
    return subprocess.Popen([sys.executable, "-m", "helpers.store_worker", command,
                             json.dumps(args)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_drop_dac_caps if drop_dac_override else None)


def finish(proc: subprocess.Popen, timeout: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"worker failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run(command: str, args: dict, drop_dac_override: bool = False) -> dict:
    return finish(start(command, args, drop_dac_override))


_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_SETPCAP = 1, 2, 8


def _prctl(*args: int) -> int:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(*args, 0, 0, 0)


def can_drop_dac_override() -> bool:
    """Linux with CAP_SETPCAP in the bounding set (root in most containers)."""
    return sys.platform.startswith("linux") and _prctl(_PR_CAPBSET_READ, _CAP_SETPCAP) == 1


def _drop_dac_caps() -> None:
    # Runs in the child before exec: caps outside the bounding set are not regained by exec.
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if _prctl(_PR_CAPBSET_DROP, cap) != 0:
            raise OSError("prctl(PR_CAPBSET_DROP) failed")
