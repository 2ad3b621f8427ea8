"""The benchmarks' timer: the median of the timed calls, the untimed first ones skipped, the
device synchronized around each timed call, the last call's result returned."""

from __future__ import annotations

import time

import pytest

from blendrag_bench.timing import median_time


def test_the_median_skips_the_first_calls_and_returns_the_last_result():
    sleeps = iter([0.2, 0.0, 0.03, 0.0])  # the first call (a compile) is the slowest by far
    calls = []

    def work():
        time.sleep(next(sleeps))
        calls.append(1)
        return len(calls)

    timed = median_time(work, 4, skip=1)
    assert timed.result == 4 and len(calls) == 4
    assert timed.seconds < 0.1  # the median of 0.0, 0.03, 0.0: the 0.2 s call is not in it


def test_sync_runs_before_and_after_each_call():
    events = []
    median_time(lambda: events.append("call"), 3, skip=1, sync=lambda: events.append("sync"))
    assert events == ["sync", "call", "sync"] * 3


@pytest.mark.parametrize("repeats, skip", [(2, 2), (0, 0), (3, -1)])
def test_no_timed_call_is_refused(repeats, skip):
    with pytest.raises(ValueError, match="repeats"):
        median_time(lambda: None, repeats, skip=skip)
