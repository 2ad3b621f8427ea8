"""The prefill workers take what they are handed, every waiting request at once when packing or
one at a time; what none has taken can be taken by another thread or dropped, never both."""

from __future__ import annotations

import threading

import pytest

from blendrag.serving.workers import PrefillWorkers


def _workers(together: bool, gate: threading.Event, busy: threading.Event | None = None):
    """Workers whose prefill records what it took, once ``gate`` opens (``busy`` set as the
    first starts)."""
    cond = threading.Condition()
    taken: list[list[str]] = []

    def prefill(jobs) -> None:
        if busy is not None:
            busy.set()
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        with cond:
            taken.append(list(jobs))
    return PrefillWorkers(1, cond, prefill, lambda: together), cond, taken


@pytest.mark.parametrize("together", [True, False])
def test_a_worker_takes_every_waiting_request_at_once_or_one_at_a_time(together):
    gate, busy = threading.Event(), threading.Event()
    workers, cond, taken = _workers(together, gate, busy)
    workers.hand(["a"])
    assert busy.wait(30)  # the worker took "a" alone and waits at the gate
    workers.hand(["b", "c"])  # waiting behind it
    gate.set()
    workers.shutdown()
    assert taken == ([["a"], ["b", "c"]] if together else [["a"], ["b"], ["c"]])


def test_what_no_worker_took_is_taken_latest_first_or_dropped():
    gate, busy = threading.Event(), threading.Event()
    workers, cond, taken = _workers(False, gate, busy)
    workers.hand(["a"])
    assert busy.wait(30)  # the only worker holds "a"
    workers.hand(["b", "c", "d"])
    with cond:
        assert workers.take() == "d"
        assert workers.drop() == ["b", "c"]
        assert workers.take() is None and workers.drop() == []
    gate.set()
    workers.shutdown()
    assert taken == [["a"]]


def test_no_workers_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        PrefillWorkers(0, threading.Condition(), lambda jobs: None, lambda: False)
