"""The loading controller's choices on synthetic timings (pure functions, deterministic)."""

from __future__ import annotations

import pytest

from blendrag import BlendConfig, CacheBlendOptions
from blendrag.engine.selection.controller import (
    LoadingConfig,
    LoadingController,
    RatioChoice,
    TierModel,
    choose_ratio,
    choose_tier,
    layer_compute_s,
)

# one layer: 3,000 chunk tokens + 64 suffix tokens at 10 us a token
SHAPE = dict(chunk_tokens=3000, other_tokens=64, token_s=10e-6)


def test_the_largest_ratio_whose_compute_hides_under_the_load():
    # load 10 ms a layer: 0.9 * 10 ms - 0.64 ms suffix = 8.36 ms for chunks
    choice = choose_ratio(10e-3, **SHAPE, floor=0.1, cap=0.5, margin=0.9)
    assert choice == RatioChoice(0.278, "load-bound")  # 8.36 / 30 = 0.2787, rounded down
    choice = choose_ratio(10e-3, **SHAPE, floor=0.3, cap=0.5, margin=0.9)
    assert choice == RatioChoice(0.3, "compute-bound: floor")
    choice = choose_ratio(15e-3, **SHAPE, floor=0.1, cap=0.5, margin=0.9)
    # (13.5 - 0.64) ms / 30 ms = 0.4287 -> 0.428
    assert (choice.ratio, choice.reason) == (0.428, "load-bound")
    hidden = layer_compute_s(choice.ratio, 3000, 64, 10e-6)
    assert hidden <= 0.9 * 15e-3 < layer_compute_s(choice.ratio + 0.002, 3000, 64, 10e-6)


def test_a_step_within_the_estimates_error_keeps_the_floor():
    # room for 0.278 over a floor of 0.25: 2.8 points, less than a 5-point minimum step
    choice = choose_ratio(10e-3, **SHAPE, floor=0.25, cap=0.5, margin=0.9, min_step=0.05)
    assert choice == RatioChoice(0.25, "load about level with compute: floor")
    assert choose_ratio(10e-3, **SHAPE, floor=0.22, cap=0.5, margin=0.9,
                        min_step=0.05).ratio == 0.278  # 5.8 points: taken
    assert choose_ratio(10e-3, **SHAPE, floor=0.25, cap=0.26, margin=0.9,
                        min_step=0.05).ratio == 0.26  # the cap is a step the user allowed
    with pytest.raises(ValueError, match="min_step"):
        LoadingConfig(min_step=1.0)


def test_never_below_the_floor_nor_above_the_cap():
    assert choose_ratio(1e-3, **SHAPE, floor=0.2, cap=0.5) == RatioChoice(0.2,
                                                                          "compute-bound: floor")
    assert choose_ratio(1.0, **SHAPE, floor=0.2, cap=0.5).ratio == 0.5
    assert choose_ratio(1.0, **SHAPE, floor=0.6, cap=0.5).ratio == 0.6  # the floor wins
    assert choose_ratio(1.0, **{**SHAPE, "chunk_tokens": 0}, floor=0.2, cap=0.5).ratio == 0.2


def test_the_controller_learns_from_requests_and_records_its_choice():
    c = LoadingController(LoadingConfig(auto_cap=0.5, margin=0.9, ema=1.0))
    ratio, info = c.decide({"disk": 1000}, 3000, 64, 3032, floor=0.2)
    assert ratio == 0.2 and info.reason.startswith("no estimate yet (disk)")
    # 32 layers of 1 MB read in 0.32 s: 10 ms a layer, 10 ns a byte
    c.observe({"disk": 0.32}, {"disk": 32_000_000}, compute_s=1.0, token_layers=96_000,
              place_s=0.0, cached_row_layers=0)
    ratio, _ = c.decide({"disk": 1_000_000}, 3000, 64, 3032, floor=0.2)
    assert ratio == 0.2  # no placing-time estimate yet: still the floor
    c.observe({}, {}, compute_s=0.97, token_layers=97_000, place_s=0.097024,
              cached_row_layers=97_024)
    assert c.token_s == pytest.approx(10e-6) and c.fixed_row_s == pytest.approx(1e-6)
    # the reader reads 10 ms and places 3,032 rows (3.032 ms) a layer:
    # (0.9 * 13.032 - 0.64) ms / 30 ms = 0.3696 -> 0.369
    ratio, info = c.decide({"disk": 1_000_000}, 3000, 64, 3032, floor=0.2)
    assert ratio == 0.369 and info.load_layer_s == pytest.approx(0.013032)
    assert info.compute_layer_s <= 0.9 * info.load_layer_s


def test_the_cheapest_tier_that_keeps_ttft_at_the_compute_bound():
    tiers = [TierModel("disk", 3.0, 20), TierModel("redis", 1.0, 100), TierModel("ram", 20.0)]
    # 32 layers, 6 entries, 12 MB a layer: disk 4.12 ms, redis 12.6 ms, ram 0.6 ms
    best, verdicts = choose_tier(tiers, 32, 12_000_000, 6, compute_layer_s=5e-3)
    assert best == "disk" and [v.compute_bound for v in verdicts] == [True, False, True]
    assert verdicts[1].ttft_s == pytest.approx(32 * (6e-4 + 12e-3))
    best, _ = choose_tier(tiers, 32, 12_000_000, 6, compute_layer_s=1e-3)
    assert best == "ram"
    assert choose_tier(tiers, 32, 12_000_000, 6, compute_layer_s=1e-4)[0] is None


def test_auto_ratio_config():
    auto = BlendConfig(selector="cacheblend", ratio="auto",
                       options=CacheBlendOptions(check_layers=(1, 2)))
    assert auto.auto_ratio and auto.ratio == 0.2 and auto.label == "blend-cacheblend@auto>=0.2"
    at = auto.at_ratio(0.35)
    assert (at.ratio, at.auto_ratio) == (0.35, False)
    assert at.schedule == pytest.approx((0.7, 0.35))
    assert BlendConfig(ratio="auto>=0.3").ratio == 0.3
    for bad in ("fast", -0.1):
        with pytest.raises(ValueError, match="ratio"):
            BlendConfig(ratio=bad)
    with pytest.raises(ValueError, match="prefetch_layers"):
        LoadingConfig(prefetch_layers=-1)
    with pytest.raises(ValueError, match="auto_cap"):
        LoadingConfig(auto_cap=1.5)
    with pytest.raises(ValueError, match="bandwidth"):
        TierModel("disk", 0.0)
