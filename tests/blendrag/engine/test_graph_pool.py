"""The memory pool the captured graphs share: kept while one of its graphs lives, a new one
once they are all gone (the caching allocator refuses a capture into a pool whose graphs are
gone while a tensor allocated in it lives on). No CUDA here: the handle and the capture are
stand-ins; what is checked is which pool each capture is given."""

from __future__ import annotations

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
