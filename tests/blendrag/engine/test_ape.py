"""APE on blend's reused rows (engine/selection/ape.py): exact where nothing is reused, the
identity at
T = S = 1, the reference formula where rows are reused, and decoding that keeps it."""

from __future__ import annotations

import math

import pytest
import torch

from blendrag import Ape, BlendConfig, GenerationConfig
from blendrag.engine.selection.ape import ApeSpan, ape_attention, ape_bias
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FULL = BlendConfig(mode="full")
GEN = GenerationConfig(max_new_tokens=8, eos_token_ids=())


def test_ape_attention_is_the_papers_formula():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((4, 3, 8), (2, 20, 8), (2, 20, 8)))
    pos = torch.tensor([17, 18, 19])
    stale = torch.zeros(20, dtype=torch.bool)
    stale[4:15] = True
    ape = Ape(temperature=0.8, scale=1.3)
    got = ape_attention(q, k, v, *ape_bias(pos, stale, ape, None), 0.35)
    for h in range(4):  # q head h reads KV head h // 2
        logits = q[h] @ k[h // 2].T * 0.35  # [3, 20]
        logits[:, stale] = logits[:, stale] / 0.8 + math.log(1.3)
        logits = logits.masked_fill(torch.arange(20)[None] > pos[:, None], float("-inf"))
        assert torch.allclose(got[h], logits.softmax(-1) @ v[h // 2], atol=1e-6)
    # T = S = 1 is plain causal attention
    plain = ape_attention(q, k, v, *ape_bias(pos, stale, Ape(1.0, 1.0), None), 0.35)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0),
        attn_mask=torch.arange(20)[None] <= pos[:, None], scale=0.35)
    assert torch.allclose(plain, ref, atol=1e-6)


def test_stale_rows_are_the_chunk_rows_not_recomputed():
    span = ApeSpan(Ape(), chunk_start=3, suffix_start=10)
    stale = span.stale(torch.tensor([4, 7, 10, 11]), 12)
    assert stale.nonzero()[:, 0].tolist() == [3, 5, 6, 8, 9]


def test_exact_at_ratio_one_and_unchanged_at_unit_temperature(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    full = engine.prefill(layout, FULL).logits
    for selector in ("preview", "cacheblend"):  # static and check-layer selectors
        one = engine.prefill(layout, BlendConfig(selector=selector, ratio=1.0, ape=Ape(0.7, 2.0)))
        assert (one.logits - full).abs().max() < 1e-4, selector
    plain = BlendConfig(selector="preview", ratio=0.2)
    unit = BlendConfig(selector="preview", ratio=0.2, ape=Ape(1.0, 1.0))
    assert (engine.prefill(layout, unit).logits
            - engine.prefill(layout, plain).logits).abs().max() < 1e-4
    gen = engine.generate(layout, unit, GEN).token_ids
    assert gen == engine.generate(layout, plain, GEN).token_ids


def test_ape_changes_what_reads_reused_rows_and_decodes_with_it(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    for mode in ("reuse", "blend"):
        plain = BlendConfig(mode=mode, ratio=0.2)
        sharp = BlendConfig(mode=mode, ratio=0.2, ape=Ape(0.5, 1.5))
        assert sharp.label.endswith("+ape0.5x1.5")
        # one request at a time: they share the engine's pooled buffer
        a = engine.prefill(layout, plain, extra_capacity=2)
        token = int(a.logits.argmax())
        plain_logits, plain_step = a.logits, engine.runner.decode(token, a.fused)
        del a
        b = engine.prefill(layout, sharp, extra_capacity=2)
        assert (plain_logits - b.logits).abs().max() > 1e-3, mode
        assert b.fused.ape_stale is not None and b.fused.ape_stale[:, :layout.num_tokens].any()
        # the decoded token reads reused rows with APE too (the eager step, whatever the runner)
        assert (engine.runner.decode(token, b.fused) - plain_step).abs().max() > 1e-4
        del b


def test_bad_ape_settings_are_refused(engine_for):
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="Ape.temperature must be a finite number > 0"):
            Ape(temperature=bad)
    with pytest.raises(ValueError, match="for blend or reuse"):
        BlendConfig(mode="full", ape=Ape())
    engine = engine_for("gemma2")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with pytest.raises(ValueError, match="soft-capped attention"):
        engine.prefill(layout, BlendConfig(ratio=0.2, ape=Ape()))
