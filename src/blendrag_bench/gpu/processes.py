"""The GPU check's phases as processes: stopped with everything they started, and with the
check however the check ends (a phase left running would hold the GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable


class Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


def kill(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything it started (its process group), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def die_with_parent(parent: int) -> Callable[[], None]:
    """For ``preexec_fn``: the child is killed when its parent dies, however it dies (SIGKILL
    too, which no handler sees): Linux's PR_SET_PDEATHSIG; elsewhere nothing."""

    def arm() -> None:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm
