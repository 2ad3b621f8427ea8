"""Selectors choose the tokens they promise; more recompute means less deviation."""

from __future__ import annotations

import math

import pytest
import torch

from blendrag import BlendConfig, CacheBlendOptions, RandomOptions
from blendrag.engine.selection.selectors import make_selector
from blendrag.eval.deviation import attention_deviation, traced_prefill
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def selector(engine, layout, **kw):
    return make_selector(BlendConfig(**kw), layout, engine.adapter.num_layers, engine.device,
                         engine.adapter.scaling)


def test_epic_picks_the_first_tokens_of_every_chunk(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    picked = selector(engine, layout, selector="epic", ratio=0.3).initial().tolist()
    expected = []
    for s, e in layout.chunk_spans:
        expected += list(range(s, s + math.ceil(0.3 * (e - s))))
    assert picked == expected


def test_random_is_seeded_and_inside_chunks(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    a = selector(engine, layout, selector="random", ratio=0.2,
                 options=RandomOptions(seed=1)).initial()
    b = selector(engine, layout, selector="random", ratio=0.2,
                 options=RandomOptions(seed=1)).initial()
    c = selector(engine, layout, selector="random", ratio=0.2,
                 options=RandomOptions(seed=2)).initial()
    chunk_tokens = layout.suffix_start - len(layout.prefix_ids)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.numel() == math.ceil(0.2 * chunk_tokens)
    assert a.min() >= len(layout.prefix_ids) and a.max() < layout.suffix_start


def test_cacheblend_keeps_the_most_deviating_tokens(engine_for):
    """Deviation is real: kept tokens deviate more than dropped ones at the check layer."""
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full"))
    reuse = engine.prefill(layout, BlendConfig(mode="reuse"))
    pre, trace = traced_prefill(engine, layout, BlendConfig(selector="cacheblend", ratio=0.2))
    kept = trace.layers[1]["pos"]
    kept = kept[kept < layout.suffix_start]
    # at layer 1, all chunk tokens were recomputed at layer 0: fresh v at layer 1 == full's v
    chunk = torch.arange(len(layout.prefix_ids), layout.suffix_start)
    dev = (full.fused.v[1][:, chunk] - reuse.fused.v[1][:, chunk]).pow(2).sum(dim=(0, 2))
    top = chunk[torch.topk(dev, kept.numel()).indices].sort().values
    assert torch.equal(kept, top)


def test_gradual_filtering_follows_the_schedule(engine_for):
    engine = engine_for("llama", layers=5)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    cfg = BlendConfig(selector="cacheblend", ratio=0.1,
                      options=CacheBlendOptions(check_layers=(1, 2, 3)))
    assert cfg.schedule == (0.4, 0.2, 0.1)
    s = engine.prefill(layout, cfg).stats
    c = s.prompt.chunk_tokens
    budgets = [math.ceil(r * c) for r in cfg.schedule]
    assert s.compute.recomputed_chunk_tokens_per_layer == [c, budgets[0], budgets[1], budgets[2],
                                                   budgets[2]]


def test_query_selector_prefers_tokens_the_question_attends(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    pre, trace = traced_prefill(engine, layout, BlendConfig(selector="query", ratio=0.25))
    s = pre.stats
    kept = math.ceil(0.25 * s.prompt.chunk_tokens)
    assert s.compute.recomputed_chunk_tokens_per_layer[1:] == [kept] * 2
    kept = set(trace.layers[1]["pos"].tolist())
    assert set(range(layout.suffix_start, layout.num_tokens)) <= kept


def test_attention_deviation_falls_as_ratio_rises(engine_for):
    engine = engine_for("llama", layers=4)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    ref = traced_prefill(engine, layout, BlendConfig(mode="full"))
    for sel in ("cacheblend", "random"):
        devs = [attention_deviation(engine, layout, BlendConfig(selector=sel, ratio=r), ref)
                for r in (0.0, 0.15, 0.5, 1.0)]
        reuse = attention_deviation(engine, layout, BlendConfig(mode="reuse"), ref)
        assert all(b <= a + 1e-6 for a, b in zip(devs, devs[1:])), (sel, devs)
        assert devs[-1] < 1e-4 and devs[0] > 10 * max(devs[-1], 1e-5)
        assert devs[1] < reuse


def test_spans_recompute_windows_of_neighbours_within_the_budget():
    from blendrag.engine.selection.selectors import spans

    scores = torch.zeros(40)
    scores[10], scores[30] = 5.0, 3.0
    assert spans(scores, 4, 4).tolist() == [9, 10, 11, 12]  # around the best token, whole
    got = spans(scores, 6, 4).tolist()  # a second window cut to the budget
    assert got[:4] == [9, 10, 11, 12] and 30 in got[4:] and all(29 <= g <= 32 for g in got[4:])
    g = torch.Generator().manual_seed(0)
    noisy = torch.rand(100, generator=g)
    assert spans(noisy, 17, 1).tolist() == torch.topk(noisy, 17).indices.sort().values.tolist()
    for count in (1, 9, 50, 100):
        got = spans(noisy, count, 5)
        assert got.numel() == count and torch.equal(got, got.unique())  # sorted, no repeats


def test_preview_spans_keep_the_ratio_and_say_so_in_the_label(engine_for):
    from blendrag import PreviewOptions

    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    plain = engine.prefill(layout, BlendConfig(selector="preview", ratio=0.3))
    config = BlendConfig(selector="preview", ratio=0.3, options=PreviewOptions(span=4))
    windows = engine.prefill(layout, config)
    assert config.label == "blend-preview/span4@0.3"
    assert windows.stats.recompute_fraction == plain.stats.recompute_fraction
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="span must be an integer >= 1"):
            BlendConfig(selector="preview", ratio=0.3, options=PreviewOptions(span=bad))
