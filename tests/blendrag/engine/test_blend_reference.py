"""A partial blend against a naive reference of selective recompute, and decoding after it.

The exactness tests check blend at ratio 1.0 (= full prefill) and reuse (= HF on a cache); a
partial blend is neither, so a wrong mask, position or row could pass them. This reference
recomputes, with HF's own modules and explicit [A, N] attention matrices, exactly what
selective recompute means: at every layer the selected tokens and the suffix are computed; each
attends to every key at a position <= its own, the key being the fresh one where that position
is computed and the cached one (rotated to its position) elsewhere. Decoding then appends
tokens that attend to those fused rows. The engine must give the same logits at the first token
and at every decoded token (the rows the blend pass wrote are the rows decoding reads).
"""

from __future__ import annotations

import math

import pytest
import torch

from blendrag import BlendConfig, RandomOptions
from blendrag.engine.compute.observers import Trace
from blendrag.engine.selection.selectors import RandomSelector, SelectorInputs
from blendrag.eval.answer import greedy_answer
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

TOL = 1e-4


def _cached_rows(engine, layout) -> tuple[torch.Tensor, torch.Tensor]:
    """keys (pre-RoPE), values: [L, Hkv, S, D] of the prefix and the chunks, from the store."""
    prefix = engine.cache.prefix(layout.prefix_ids)
    pieces = [prefix] + [engine.cache.kv(layout.prefix_ids, c) for c in layout.chunk_ids]
    return torch.cat([p.keys for p in pieces], 2), torch.cat([p.values for p in pieces], 2)


def _reference(engine, ids: list[int], computed: torch.Tensor, keys, values):
    """Selective recompute, naively: ``computed`` [A] sorted positions (the last one included)
    computed at every layer over the cached rows ``keys``/``values`` [L, Hkv, N', D] (N' <= N;
    positions past N' are always computed). Returns the last position's logits and the fused
    rows per layer: k (rotated), v [L, Hkv, N, D]."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = engine.model.model
    cfg = engine.model.config
    n, heads, kv_heads = len(ids), cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // heads
    cos, sin = model.rotary_emb(keys, torch.arange(n)[None])  # [1, N, D]
    h = model.embed_tokens(torch.tensor(ids)[computed])[None]  # [1, A, hidden]
    fused_k, fused_v = [], []
    for i, layer in enumerate(model.layers):
        x = layer.input_layernorm(h)
        q = layer.self_attn.q_proj(x).view(1, -1, heads, d).transpose(1, 2)  # [1, H, A, D]
        k = layer.self_attn.k_proj(x).view(1, -1, kv_heads, d).transpose(1, 2)
        v = layer.self_attn.v_proj(x).view(1, -1, kv_heads, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos[:, computed], sin[:, computed])
        s = keys.shape[2]
        _, k_all = apply_rotary_pos_emb(keys[i][None], keys[i][None], cos[:, :s], sin[:, :s])
        k_all = torch.cat([k_all, torch.zeros(1, kv_heads, n - s, d)], 2)  # [1, Hkv, N, D]
        v_all = torch.cat([values[i][None], torch.zeros(1, kv_heads, n - s, d)], 2)
        k_all[:, :, computed], v_all[:, :, computed] = k, v
        fused_k.append(k_all[0])
        fused_v.append(v_all[0])
        rep = heads // kv_heads
        scores = q @ k_all.repeat_interleave(rep, 1).transpose(2, 3) / math.sqrt(d)  # [1,H,A,N]
        allowed = torch.arange(n)[None, :] <= computed[:, None]  # [A, N]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        o = (probs @ v_all.repeat_interleave(rep, 1)).transpose(1, 2).reshape(1, -1, heads * d)
        h = h + layer.self_attn.o_proj(o)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    logits = engine.model.lm_head(model.norm(h))[0, -1].float()
    return logits, torch.stack(fused_k), torch.stack(fused_v)


def _assert_decoding_reads_the_blend_rows(engine, layout, pre, computed, keys, values,
                                          tokens: int) -> None:
    """Decoding after the blend reads the rows it wrote: each decoded token's logits equal the
    reference's with the tokens before it appended and computed (attending to the same fused
    rows)."""
    answer = greedy_answer(engine, pre, tokens)
    for t in range(1, len(answer.token_ids)):
        ids = layout.ids + list(answer.token_ids[:t])
        extended = torch.cat([computed, torch.arange(layout.num_tokens, len(ids))])
        with torch.no_grad():
            step, _, _ = _reference(engine, ids, extended, keys, values)
        assert (answer.logits[t] - step).abs().max().item() < TOL, t


@pytest.mark.parametrize("ratio", [0.2, 0.5])
def test_partial_blend_and_its_decoding_equal_the_naive_reference(engine_for, ratio):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    config = BlendConfig(selector="random", ratio=ratio, options=RandomOptions(seed=3))
    selected = RandomSelector(config, SelectorInputs(layout, torch.device("cpu"), 1.0)).initial()
    computed = torch.cat([selected, torch.arange(layout.suffix_start, layout.num_tokens)])
    keys, values = _cached_rows(engine, layout)
    with torch.no_grad():
        ref, _, _ = _reference(engine, layout.ids, computed, keys, values)
    pre = engine.prefill(layout, config, extra_capacity=4)
    assert pre.stats.compute.recomputed_chunk_tokens_per_layer[0] == len(selected) > 0
    assert (pre.logits - ref).abs().max().item() < TOL
    # not vacuous: full prefill and reuse differ from it
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    assert (pre.logits - full).abs().max().item() > 1e-3
    _assert_decoding_reads_the_blend_rows(engine, layout, pre, computed, keys, values, 4)


def test_preview_blend_over_the_preview_pass_rows_equals_the_reference(engine_for):
    """The default path: chunks stored in the ingestion context, the first passage's exact
    rows, the preview pass loading the cached rows that the blend pass then computes over."""
    from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext

    engine = engine_for("llama", context=ChunkContext())
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))
    trace = Trace()
    pre = engine.prefill(layout, BlendConfig(ratio=0.3), extra_capacity=4, observers=[trace])
    assert pre.stats.cache.exact_first
    computed = trace.layers[0]["pos"]  # the preview selector's choice, and the suffix
    assert len(computed) < layout.num_tokens - len(layout.prefix_ids)
    prefix = engine.cache.prefix(layout.prefix_ids)
    pieces = [prefix, engine.cache.kv(layout.prefix_ids, layout.chunk_ids[0], NO_CONTEXT)]
    pieces += [engine.cache.kv(layout.prefix_ids, c) for c in layout.chunk_ids[1:]]
    keys = torch.cat([p.keys for p in pieces], 2)
    values = torch.cat([p.values for p in pieces], 2)
    with torch.no_grad():
        ref, _, _ = _reference(engine, layout.ids, computed, keys, values)
    assert (pre.logits - ref).abs().max().item() < TOL
    _assert_decoding_reads_the_blend_rows(engine, layout, pre, computed, keys, values, 3)
