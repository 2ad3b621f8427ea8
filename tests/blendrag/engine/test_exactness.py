"""The exactness rules (docs/architecture.md): the exact modes equal a full prefill, on
identical ids, with the CPU's attention kernels and with the GPU's (FlexAttention, compiled
here too)."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, CacheBlendOptions, ComputeConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
TOL = 1e-4
KERNELS = {"sdpa": ComputeConfig(attention="sdpa"), "flex": ComputeConfig(attention="flex")}


def hf_last_logits(engine, layout) -> torch.Tensor:
    with torch.no_grad():
        return engine.model(torch.tensor([layout.ids])).logits[0, -1].float()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_blend_ratio_one_equals_full_and_hf(engine_for, family, kernel):
    engine = engine_for(family, compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    assert max_diff(full, hf_last_logits(engine, layout)) < TOL
    for selector in ("preview", "cacheblend", "epic", "query", "random"):
        blend = engine.prefill(layout,
                               BlendConfig(mode="blend", selector=selector, ratio=1.0)).logits
        assert max_diff(blend, full) < TOL, selector
    # and a partial blend really differs (the comparison is not vacuous)
    partial = engine.prefill(layout, BlendConfig(mode="blend", ratio=0.1)).logits
    assert max_diff(partial, full) > 1e-3


def test_blend_ratio_one_with_chat_template(engine_for):
    engine = engine_for("llama", chat=True)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    # template tail is in the suffix
    assert engine.tokenizer.convert_tokens_to_ids("<|end|>") in layout.suffix_ids
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    blend = engine.prefill(layout,
                           BlendConfig(selector="cacheblend", ratio=1.0,
                                       options=CacheBlendOptions((1, 2), (1.0, 1.0)))).logits
    assert max_diff(full, hf_last_logits(engine, layout)) < TOL
    assert max_diff(blend, full) < TOL


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_prefix_mode_equals_full(engine_for, family, kernel):
    engine = engine_for(family, compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full"))
    pre = engine.prefill(layout, BlendConfig(mode="prefix"))
    assert max_diff(pre.logits, full.logits) < TOL
    assert pre.stats.cache.tokens_reused == len(layout.prefix_ids) + len(layout.chunk_ids[0])
    # the KV rows equal too, not only the logits
    n = layout.num_tokens
    assert max_diff(pre.fused.k[:, :, :n], full.fused.k[:, :, :n]) < TOL


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_reuse_single_chunk_after_prefix_equals_full(engine_for, kernel):
    engine = engine_for("llama", compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    reuse = engine.prefill(layout, BlendConfig(mode="reuse"))
    assert max_diff(reuse.logits, full) < TOL
    layers = engine.adapter.num_layers
    assert reuse.stats.compute.computed_per_layer == [len(layout.suffix_ids)] * layers


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_reuse_several_chunks_equals_dynamic_cache_reference(engine_for, family, kernel):
    """Independent reference: HF's own forward of the suffix on a DynamicCache built from the
    per-chunk KVs rotated (with HF's apply_rotary_pos_emb) to their positions."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    engine = engine_for(family, compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).logits

    pieces = [engine.cache.prefix(layout.prefix_ids)]
    pieces += [engine.cache.kv(layout.prefix_ids, c) for c in layout.chunk_ids]
    keys = torch.cat([p.keys for p in pieces], dim=2)  # [L, Hkv, S, D] pre-RoPE
    values = torch.cat([p.values for p in pieces], dim=2)
    s = keys.shape[2]
    cos, sin = engine.model.model.rotary_emb(keys, torch.arange(layout.num_tokens)[None])
    cache = DynamicCache(config=engine.model.config)
    for layer in range(keys.shape[0]):
        _, k_rot = apply_rotary_pos_emb(
            keys[layer][None], keys[layer][None], cos[:, :s], sin[:, :s]
        )
        cache.update(k_rot, values[layer][None], layer)
    suffix = torch.tensor([layout.suffix_ids])
    with torch.no_grad():
        ref = engine.model(suffix, past_key_values=cache,
                           position_ids=torch.arange(s, layout.num_tokens)[None]).logits[0, -1]
    assert max_diff(reuse, ref) < TOL
    # cross-chunk loss is real
    assert max_diff(reuse, engine.prefill(layout, BlendConfig(mode="full")).logits) > 1e-3


def test_static_selector_at_ratio_zero_equals_reuse(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).logits
    epic0 = engine.prefill(layout, BlendConfig(selector="epic", ratio=0.0)).logits
    assert max_diff(epic0, reuse) < TOL


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_sliding_window_full_equals_hf(engine_for, kernel):
    engine = engine_for("mistral", sliding_window=16, compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    assert layout.num_tokens > 16
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    blend = engine.prefill(layout, BlendConfig(ratio=1.0)).logits
    assert max_diff(full, hf_last_logits(engine, layout)) < TOL
    assert max_diff(blend, full) < TOL


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_half_precision_blend_one_close_to_full(engine_for, dtype, kernel):
    engine = engine_for("llama", dtype=dtype, compute=KERNELS[kernel])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    blend = engine.prefill(layout, BlendConfig(ratio=1.0)).logits
    hf = hf_last_logits(engine, layout)
    scale = full.abs().max().item()
    assert max_diff(full, hf) < 0.05 * scale
    assert max_diff(blend, full) < 0.05 * scale
    assert int(blend.argmax()) == int(full.argmax())


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_tied_embeddings_and_rope_scaling_equal_full(engine_for, kernel):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    engine = engine_for("llama", tie=True, rope=rope, compute=KERNELS[kernel])
    assert (
        engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    )
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    assert max_diff(full, hf_last_logits(engine, layout)) < TOL
    assert max_diff(engine.prefill(layout, BlendConfig(ratio=1.0)).logits, full) < TOL


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_a_partial_blend_through_flex_attention_equals_the_row_blocks(engine_for, family,
                                                                     monkeypatch):
    """The GPU's kernel on the blend's scattered queries, in the engine: the same logits as the
    CPU's row blocks at a partial ratio, for each selector (the ratio-1.0 tests above compute
    every token, which takes the causal kernel). FlexAttention compiled for each shape: on the
    CPU, Inductor fails to build the dynamic-shape kernel for later shapes (see
    test_attention.py ``fresh_flex``) and the engine would run its fallback."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from blendrag.engine.compute import flex as flex_module

    torch._dynamo.reset()
    compiled, calls = torch.compile(flex_attention, dynamic=False), []

    def counted(*args, **kwargs):
        calls.append(1)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(flex_module, "_FLEX", [counted])
    rows = engine_for(family, compute=KERNELS["sdpa"])
    flex = engine_for(family, compute=KERNELS["flex"])
    layout = rows.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for selector in ("preview", "cacheblend", "epic"):
        config = BlendConfig(mode="blend", selector=selector, ratio=0.2)
        before = len(calls)
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # each shape static
            got = flex.prefill(layout, config).logits
        assert len(calls) > before and flex_module._FLEX == [counted], selector  # flex ran
        assert max_diff(got, rows.prefill(layout, config).logits) < TOL, selector
