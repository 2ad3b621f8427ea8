"""Counting a call's reads of tensor values by the host, on the CPU: on a GPU each is a sync
(the host waits for the device's queued work), and each can be seen anywhere."""

from __future__ import annotations

from collections import Counter

from torch.overrides import TorchFunctionMode

HOST = {"item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero"}
MADE_ON_DEVICE = "tensor(device=...)"
"""``torch.tensor(values, device=...)``: on CUDA a blocking copy, which torch follows with a
sync of the stream (counted when ``HostReads(made=True)``)."""


class HostReads(TorchFunctionMode):
    """``count``: the calls in ``HOST`` made while it is entered, by name; ``log``: the same in
    the order they were made (a test may append markers of its own). ``made``: also count
    tensors made from host values straight on a device (``MADE_ON_DEVICE``)."""

    def __init__(self, made: bool = False) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()
        self.log: list[str] = []
        self.made = made

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "tensor" and self.made and kwargs.get("device") is not None:
            name = MADE_ON_DEVICE
        if name in HOST or name == MADE_ON_DEVICE:
            self.count[name] += 1
            self.log.append(name)
        return func(*args, **kwargs)
