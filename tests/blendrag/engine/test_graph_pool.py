"""The memory pool the captured graphs share: kept while one of its graphs lives, a new one
once they are all gone (the caching allocator refuses a capture into a pool whose graphs are
gone while a tensor allocated in it lives on). No CUDA here: the handle and the capture are
stand-ins; what is checked is which pool each capture is given."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from blendrag.engine.compute import graphs


class _Graph:  # a CUDA graph's stand-in: only its life matters
    pass


@pytest.fixture
def captured(monkeypatch):
    handles = iter(range(100))
    pools: list[int] = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))

    def fake_capture(step, device, pool=None):
        pools.append(pool)
        return _Graph(), step()

    monkeypatch.setattr(graphs, "capture", fake_capture)
    return pools


def test_graphs_alive_share_their_pool(captured):
    pool = graphs.SharedPool()
    kept = [pool.capture(lambda: torch.zeros(1), torch.device("cpu"))[0] for _ in range(3)]
    assert captured == [0, 0, 0] and pool.pools == 1
    del kept[:2]  # one graph of the pool still alive
    gc.collect()
    pool.capture(lambda: torch.zeros(1), torch.device("cpu"))
    assert captured[-1] == 0 and pool.pools == 1


def test_a_new_pool_once_every_graph_is_gone(captured):
    pool = graphs.SharedPool()
    first = pool.capture(lambda: torch.zeros(1), torch.device("cpu"))[0]
    del first  # a static pass dropped its buffer's graphs
    gc.collect()
    alive = pool.capture(lambda: torch.zeros(1), torch.device("cpu"))[0]
    assert captured == [0, 1] and pool.pools == 2
    pool.capture(lambda: torch.zeros(1), torch.device("cpu"))  # the new pool's graph lives
    assert captured == [0, 1, 1] and pool.pools == 2
    del alive


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other) -> None:
        pass


@pytest.mark.parametrize("fails", [False, True])
def test_a_capture_leaves_the_threads_stream_as_it_found_it(monkeypatch, fails):
    """``torch.cuda.graph`` leaves its stream current when the capture fails; the eager
    fallback after it must run on the thread's own stream, ordered with the rest. The capture
    runs on a stream of the model's device, under that device (stand-ins: no CUDA here)."""
    before, made, current, seen = _Stream("before"), [], [], {}

    class _Device:  # torch.cuda.device(d): the device the capture runs under
        def __init__(self, device):
            seen["device"] = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class _GraphContext:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            seen["capture stream"] = stream

        def __enter__(self):
            current.append(seen["capture stream"])

        def __exit__(self, *exc):
            if fails:  # capture_end raised: torch does not restore the stream
                raise RuntimeError("operation not permitted when stream is capturing")
            current.pop()
            return False

    def stream_made(device, priority=0):
        made.append(_Stream(f"side {device} {priority}"))
        return made[-1]

    monkeypatch.setattr(torch.cuda, "device", _Device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: before)
    monkeypatch.setattr(torch.cuda, "Stream", stream_made)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _GraphContext)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: current.append(s))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(graphs, "_STREAMS", {})
    model = torch.device("cuda", 1)
    for _ in range(2):
        if fails:
            with pytest.raises(RuntimeError):
                graphs.capture(lambda: torch.zeros(1), model)
        else:
            graphs.capture(lambda: torch.zeros(1), model)
        assert seen["device"] == model and seen["capture stream"] is made[0]
        assert current[-1] is before  # the thread's stream, whatever happened
    # one capture stream for the device (graphs sharing a pool must share it), of high
    # priority (not one of the default pool's, which the layer feed and device tier take)
    assert len(made) == 1 and made[0].name == "side 1 -1"
