"""The one timer of the benchmarks and their scripts: the median of several timed calls (a
median, not a mean: one call slowed by the shared machine does not move it)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class Timed(NamedTuple):
    seconds: float  # the median of the timed calls
    result: Any  # what the last call returned


def median_time(fn: Callable[[], Any], repeats: int, *, skip: int = 0,
                sync: Callable[[], None] | None = None) -> Timed:
    """Call ``fn`` ``repeats`` times, the first ``skip`` untimed (compiling, capturing);
    ``sync`` (a device's synchronize) runs before and after each call, so that a time is
    the work's, not its launch's. ValueError unless some call is timed."""
    if repeats <= skip or skip < 0:
        raise ValueError(f"repeats ({repeats}) must be more than skip ({skip}) and skip >= 0")
    times, result = [], None
    for i in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        result = fn()
        if sync is not None:
            sync()
        if i >= skip:
            times.append(time.perf_counter() - t0)
    return Timed(statistics.median(times), result)
