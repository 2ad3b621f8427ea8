"""The compute ideal's FLOP counts, from a request's stats (blendrag_bench/flops.py)."""

from __future__ import annotations

from blendrag import BlendConfig
from blendrag_bench.flops import FlopModel
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def test_flops_of_a_request_count_its_tokens_and_its_attention(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    n, layers = layout.num_tokens, engine.adapter.num_layers
    full = engine.prefill(layout, BlendConfig(mode="full")).stats
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).stats
    preview = engine.prefill(layout, BlendConfig(selector="preview", ratio=0.3)).stats
    flops = FlopModel.of(engine.adapter)
    hidden, inter = engine.model.config.hidden_size, engine.model.config.intermediate_size
    kv = engine.adapter.num_kv_heads * engine.adapter.head_dim
    assert flops.per_token == 2 * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter)
    assert flops.request(full) == layers * (n * flops.per_token + n * (n + 1) // 2 * flops.per_key)
    assert flops.request(full) / flops.request(reuse) > 1
    # the preview pass costs what reuse costs, on top of the blend pass
    blend_only = sum(preview.compute.computed_per_layer) * flops.per_token + sum(
        preview.compute.attended_keys_per_layer) * flops.per_key
    assert flops.request(preview) == blend_only + flops.request(reuse)
