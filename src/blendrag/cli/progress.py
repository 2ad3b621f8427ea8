"""One progress line for every long phase of a command: what it does, n of N, time spent and
time left, on stderr (stdout keeps the results, e.g. ``--json``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``label: n/N unit, 12 s spent, ~30 s left``.

    On a terminal the line is rewritten in place; in a log (not a tty) a line is written at
    most every ``log_every_s`` seconds and at the end, so CI logs stay short.
    """

    def __init__(self, label: str, unit: str = "", enabled: bool = True,
                 stream: TextIO | None = None, log_every_s: float = 10.0) -> None:
        self.label, self.unit, self.enabled = label, unit, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.log_every_s = log_every_s
        self.t0 = time.perf_counter()
        self._last = -float("inf")

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        tty = getattr(self.stream, "isatty", lambda: False)()
        final = done >= total
        if not (tty or final or now - self._last >= self.log_every_s):
            return
        self._last = now
        spent = now - self.t0
        left = f", ~{_seconds(spent / done * (total - done))} left" if 0 < done < total else ""
        unit = f" {self.unit}" if self.unit else ""
        line = f"  {self.label}: {done}/{total}{unit}, {_seconds(spent)} spent{left}"
        if tty:
            print(f"\r{line}\033[K", end="\n" if final else "", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)


def _seconds(s: float) -> str:
    """``42 s`` or ``3 min 05 s``."""
    s = round(s)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"
