"""Pipelined loading (engine/compute/layer_feed.py): the same logits as sequential loading for every
mode and tier, and a tier that fails midway through a request never yields wrong logits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blendrag import BlendConfig
from blendrag.store import MemoryKVStore
from blendrag.store.errors import EntryError
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

MODES = [
    BlendConfig(mode="full"),
    BlendConfig(mode="prefix"),
    BlendConfig(mode="reuse"),
    BlendConfig(selector="preview", ratio=0.3),
    BlendConfig(selector="cacheblend", ratio=0.3),
    BlendConfig(selector="epic", ratio=0.3),
    BlendConfig(selector="profile", ratio=0.3),
]
LAYERS = 4  # the tiny model's depth here: failures are injected at a middle layer


@pytest.fixture
def tier_store(make_store, request, redis_prefix):
    """factory(tier, wrap=None) -> a store that serves reads from ``tier`` only."""

    def make(tier: str, wrap=None):
        if tier == "ram":
            return MemoryKVStore() if wrap is None else make_store(disk_dir=None, wrap=wrap)
        kw = {"ram_bytes": 0, "disk_bytes": 64 << 20}
        if tier in ("redis", "redis_cluster"):
            server = request.getfixturevalue("redis_server" if tier == "redis" else tier)
            kw.update(disk_dir=None, redis_url=server.url, redis_prefix=redis_prefix)
        if tier == "s3":
            s3 = request.getfixturevalue("s3")
            kw.update(disk_dir=None, s3_url=f"s3://{s3.bucket}/{redis_prefix.strip(':')}",
                      s3_endpoint_url=s3.endpoint)
        return make_store(wrap=wrap, **kw)

    return make


def prefill_at(engine, layout, config, prefetch: int):
    """``engine.prefill`` with ``prefetch`` layers of cached rows read ahead (0: sequential)."""
    engine.loading = replace(engine.loading, prefetch_layers=prefetch)
    return engine.prefill(layout, config)


@pytest.fixture(scope="module")
def reference(model_dir):
    """Logits of every mode from an engine on the default RAM store, read sequentially."""
    from blendrag import BlendEngine
    from blendrag.engine.caches.context import NO_CONTEXT

    engine = BlendEngine.from_pretrained(model_dir("llama", layers=LAYERS), device="cpu",
                                         chat=False, context=NO_CONTEXT)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=True)
    return {c.label: prefill_at(engine, layout, c, 0).logits for c in MODES}


@pytest.fixture
def engine_on(engine_for):
    def make(store):
        engine = engine_for("llama", layers=LAYERS)
        engine.store = store
        layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
        engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=True)
        return engine, layout

    return make


@pytest.mark.parametrize("tier", ["ram", "disk", "redis", "redis_cluster", "s3"])
def test_pipelined_equals_sequential_for_every_mode(tier_store, engine_on, reference, tier,
                                                    one_thread):
    engine, layout = engine_on(tier_store(tier))
    for config in MODES:
        sequential = prefill_at(engine, layout, config, 0)
        pipelined = prefill_at(engine, layout, config, 2)
        assert torch.equal(pipelined.logits, sequential.logits), config.label
        # and both equal the RAM store's: the bytes of every tier are the rows computed
        assert torch.equal(sequential.logits, reference[config.label]), config.label
        assert not sequential.stats.loading.pipelined
        # rows in RAM on a CPU are on the request KV's device already: no reader to start
        assert pipelined.stats.loading.pipelined == (config.mode != "full" and tier != "ram")
        if config.mode != "full" and tier != "ram":  # the layers really came from the tier
            assert pipelined.stats.cache.store["tiers"][0]["bytes_read"] > 0
            assert pipelined.stats.loading.load_s > 0


class FailAt:
    """A tier whose layered entries fail at ``layer``: ``EntryError`` (a checksum mismatch)
    or ``OSError`` (the tier going away) - once, for the first entry read that far."""

    def __init__(self, tier, layer: int, error: type[BaseException]) -> None:
        self.tier, self.layer, self.error, self.failed = tier, layer, error, []
        self.name, self.label, self.errors = tier.name, tier.label, tier.errors
        self.volatile = tier.volatile

    def __getattr__(self, name):
        return getattr(self.tier, name)

    def open_layers(self, key):
        entry = self.tier.open_layers(key)
        return None if entry is None else _Failing(entry, self)


class _Failing:
    def __init__(self, entry, owner: FailAt) -> None:
        self._entry, self._owner = entry, owner

    def __getattr__(self, name):
        return getattr(self._entry, name)

    def layer(self, i):
        owner = self._owner
        if i == owner.layer and not owner.failed:
            owner.failed.append(self._entry.key)
            raise owner.error(f"injected failure at layer {i}")
        return self._entry.layer(i)


@pytest.mark.parametrize("error", [EntryError, OSError])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_tier_failing_midway_falls_back_to_recompute(tier_store, engine_on, reference,
                                                       error, prefetch, one_thread):
    wraps: list[FailAt] = []

    def wrap(tier):
        wraps.append(FailAt(tier, layer=2, error=error))
        return wraps[-1]

    store = tier_store("disk", wrap=wrap)
    engine, layout = engine_on(store)
    config = BlendConfig(selector="cacheblend", ratio=0.3)
    pre = prefill_at(engine, layout, config, prefetch)
    # the right logits: those of a request whose rows all loaded (never a mix)
    assert torch.equal(pre.logits, reference[config.label])
    assert pre.stats.cache.load_retries == 1
    [bad] = wraps[0].failed
    if error is EntryError:  # a defective entry is dropped, then computed and stored again
        assert pre.stats.cache.chunk_misses + (not pre.stats.cache.prefix_hit) == 1
        assert store.stats().tier("disk").corrupt == 1
        assert store.contains(bad)
    else:  # a failing tier is benched: the retry computes every chunk
        assert not store.stats().tier("disk").available
        assert pre.stats.cache.chunk_hits == 0
    again = prefill_at(engine, layout, config, prefetch)
    assert torch.equal(again.logits, reference[config.label])
    assert again.stats.cache.load_retries == 0


def test_auto_ratio_recomputes_more_when_loading_is_slow(tier_store, engine_on, one_thread):
    from blendrag.store.throttle import Throttle, ThrottledTier

    slow = Throttle(bandwidth_gbps=0.002, latency_us=100)  # ~40 ms a tiny chunk's layer
    engine, layout = engine_on(tier_store("disk", wrap=lambda t: ThrottledTier(t, slow)))
    auto = BlendConfig(selector="cacheblend", ratio="auto")
    first = engine.prefill(layout, auto)  # no estimate yet: the floor
    assert first.stats.ratio == 0.2
    assert first.stats.controller.ratio.reason.startswith("no estimate")
    second = engine.prefill(layout, auto)
    assert second.stats.controller.ratio.reason == "load-bound: capped"
    assert second.stats.ratio == engine.loading.auto_cap
    floor = engine.prefill(layout, BlendConfig(selector="cacheblend", ratio=0.2))
    assert second.stats.recompute_fraction > floor.stats.recompute_fraction
    # sequential loading has nothing to hide recompute under: the floor
    seq = prefill_at(engine, layout, auto, 0)
    assert seq.stats.ratio == 0.2 and seq.stats.controller.ratio.reason.startswith("sequential")
