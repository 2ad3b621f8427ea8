"""Gemma 2, Gemma 3, Phi-3 and OLMo 2 checked against HF's own forward and generate (tiny
random-weight models, no download): full prefill = HF, blend at ratio 1.0 = full for every
selector, prefix and single-chunk reuse = full, pipelined loading = sequential, greedy decoding
= ``model.generate``, in float32 and bfloat16, on prompts past the sliding window; a chat's
next turn from the prefix cache = HF (float32).

Tolerances. float32: 1e-5 (measured: at most 5e-7). bfloat16: 2^-5 of the largest logit.
Where HF's kernels and the engine's do the same arithmetic the logits are bit-equal in
bfloat16 too (Gemma 2's eager attention, OLMo 2, every layer without a window); a windowed layer
runs HF's fused attention over one masked block and the engine's over blocks of 64 queries, so
its float32 accumulations are tiled differently and an attention output may round to the
neighbouring bfloat16 value (2^-8 relative); the following layers carry that on to the logits:
measured at most 1.2% of the largest logit (Gemma 3), 0.6% (Phi-3). The bound leaves 2.6x
room, and the argmax must agree.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, ComputeConfig, GenerationConfig
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.prompt import PromptLayout
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

# per family, the tiny config: Gemma alternates local (window 16) and global layers; Phi-3
# rotates 3/4 of each head (Phi-4-mini's partial rotary) under a window on every layer, wide
# enough (3 layers x 32) that cached rows still differ from full ones
FAMILIES = {
    "gemma2": dict(layers=4),
    "gemma3": dict(layers=4),
    "phi3": dict(partial_rotary_factor=0.75, sliding_window=32),
    "olmo2": dict(),
}
DTYPES = ["float32", "bfloat16"]
SELECTORS = ["preview", "cacheblend", "epic", "query", "random", "profile"]


def tolerance(dtype: str, reference: torch.Tensor) -> float:
    """See the module docstring."""
    return 1e-5 if dtype == "float32" else 2**-5 * reference.abs().max().item()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def hf_last_logits(engine, ids) -> torch.Tensor:
    with torch.no_grad():
        return engine.model(torch.tensor([ids])).logits[0, -1].float()


# the CPU's kernels (SDPA row blocks, eager decoding) and the GPU's (FlexAttention, compiled
# here too, and the fixed-shape decoding step a CUDA graph replays there)
COMPUTES = {"sdpa": ComputeConfig(attention="sdpa", decode="eager"),
            "flex": ComputeConfig(attention="flex", decode="graph", passes="graph")}


@pytest.fixture(params=[(f, d, c) for f in FAMILIES for d in DTYPES for c in COMPUTES],
                ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}")
def case(request, engine_for):
    """(engine, dtype, layout): every family in every dtype with each kernel set, on the
    four-passage prompt."""
    family, dtype, compute = request.param
    engine = engine_for(family, dtype=dtype, compute=COMPUTES[compute], **FAMILIES[family])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    windows = {engine.adapter.sliding_window(i) for i in range(engine.adapter.num_layers)}
    assert all(w is None or w < layout.num_tokens for w in windows)  # past the window
    return engine, dtype, layout


def test_full_equals_hf_and_blend_at_one_equals_full(case):
    engine, dtype, layout = case
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    hf = hf_last_logits(engine, layout.ids)
    tol = tolerance(dtype, hf)
    assert max_diff(full, hf) < tol
    assert int(full.argmax()) == int(hf.argmax())
    for selector in SELECTORS:
        blend = engine.prefill(layout, BlendConfig(selector=selector, ratio=1.0)).logits
        assert max_diff(blend, full) < tol, selector
    # a partial blend really differs: the comparisons above are not vacuous
    partial = engine.prefill(layout, BlendConfig(ratio=0.1)).logits
    assert max_diff(partial, full) > 5 * tol


def test_prefix_and_single_chunk_reuse_equal_full(case):
    engine, dtype, layout = case
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    tol = tolerance(dtype, full)
    assert max_diff(engine.prefill(layout, BlendConfig(mode="prefix")).logits, full) < tol
    one = engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX)
    full_one = engine.prefill(one, BlendConfig(mode="full")).logits
    assert max_diff(engine.prefill(one, BlendConfig(mode="reuse")).logits, full_one) < tol


def test_precomputed_chunks_load_pipelined_as_sequentially(case):
    engine, _, layout = case
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=True)
    configs = [BlendConfig(mode="reuse"), BlendConfig(ratio=0.3),
               BlendConfig(selector="cacheblend", ratio=0.3)]
    before = engine.loading
    try:
        sequential = [engine.prefill(layout, c).logits for c in configs]
        engine.loading = replace(before, prefetch_layers=2)
        for config, ref in zip(configs, sequential):
            assert torch.equal(engine.prefill(layout, config).logits, ref), config.label
    finally:
        engine.loading = before


def test_greedy_decoding_equals_hf_generate(case):
    """Decoding HF's own tokens gives HF's logits at every step (the decode path, past the
    window, whatever the tokens); the greedy tokens equal HF's: all of them in float32, in
    bfloat16 those before the first step whose two best logits are closer than rounding can
    tell apart (the tiny Gemma 3 meets 1.0547 against 1.0547 at its 9th token)."""
    engine, dtype, layout = case
    steps = 12
    with torch.no_grad():
        out = engine.model.generate(torch.tensor([layout.ids]), max_new_tokens=steps,
                                    do_sample=False, eos_token_id=None, pad_token_id=0,
                                    output_logits=True, return_dict_in_generate=True)
    ref = out.sequences[0, layout.num_tokens:].tolist()
    hf = [logits[0].float() for logits in out.logits]  # [vocab] per step
    pre = engine.prefill(layout, BlendConfig(mode="full"), extra_capacity=steps)
    ours = [pre.logits] + [engine.runner.decode(t, pre.fused) for t in ref[:-1]]
    for step in range(steps):
        assert max_diff(ours[step], hf[step]) < tolerance(dtype, hf[step]), step
    tokens = engine.generate(layout, BlendConfig(mode="full"),
                             GenerationConfig(max_new_tokens=steps, eos_token_ids=())).token_ids
    for step in range(steps):
        top2 = hf[step].topk(2).values
        if top2[0] - top2[1] < 2 * tolerance(dtype, hf[step]):  # a tie within rounding
            break
        assert tokens[step] == ref[step], step
    if dtype == "float32":
        assert tokens == ref


@pytest.mark.parametrize("family", FAMILIES)
def test_next_turn_from_the_prefix_cache_equals_hf(model_dir, family):
    """The prefix cache keeps rotated rows (each layer's own table): the next turn of a chat,
    started from the first turn's rows and answer, is HF's forward of the whole prompt."""
    engine = BlendEngine.from_pretrained(model_dir(family, **FAMILIES[family]), device="cpu",
                                         chat=False, context=NO_CONTEXT,
                                         prefix_cache_bytes=64 << 20)
    full = BlendConfig(mode="full")
    first = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    answer = engine.generate(first, full, GenerationConfig(max_new_tokens=8, eos_token_ids=()))
    question = engine.prompts.encode("\nWhere?" + SUFFIX)
    second = PromptLayout(first.prefix_ids, first.chunk_ids,
                          [*first.suffix_ids, *answer.token_ids, *question])
    pre = engine.prefill(second, full)
    assert pre.stats.cache.prefix_cache_tokens > first.num_tokens // 2
    assert max_diff(pre.logits, hf_last_logits(engine, second.ids)) < 1e-5
