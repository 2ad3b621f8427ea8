"""Counting a call's reads of tensor values by the host, on the CPU: on a GPU each is a sync
(the host waits for the device's queued work), and each can be seen anywhere."""

from __future__ import annotations

from collections import Counter

from torch.overrides import TorchFunctionMode

HOST = {"item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero"}


class HostReads(TorchFunctionMode):
    """``count``: the calls in ``HOST`` made while it is entered, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST:
            self.count[name] += 1
        return func(*args, **(kwargs or {}))
