"""What a known family cannot run exactly is refused by name, never run wrong; Phi-3's longrope
runs exactly within the context where its frequencies are fixed, and is refused past it."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, build_config

# Phi-3.5 / Phi-4-mini style: short factors up to the original context, long ones past it
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
            "long_factor": [2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0]}
ORIGINAL = 96


def test_gemma3_bidirectional_attention_is_refused_by_name(engine_for):
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        engine_for("gemma3", layers=2, use_bidirectional_attention=True)


def test_unknown_layer_type_is_refused_by_name():
    from transformers import AutoModelForCausalLM

    from blendrag.model.adapters import adapter_for

    config = build_config("gemma2", layers=2)
    model = AutoModelForCausalLM.from_config(config)
    model.config.layer_types = ["sliding_attention", "chunked_attention"]
    with pytest.raises(ValueError, match=r"gemma2: layer types \['chunked_attention'\]"):
        adapter_for(model)


def test_phi3_longrope_is_exact_within_its_original_context(engine_for):
    engine = engine_for("phi3", rope=LONGROPE, original_max_position_embeddings=ORIGINAL)
    assert engine.adapter.max_positions == ORIGINAL
    layout = engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX)
    steps = 6
    assert layout.num_tokens + steps <= ORIGINAL
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    with torch.no_grad():
        hf = engine.model(torch.tensor([layout.ids])).logits[0, -1].float()
        ref = engine.model.generate(torch.tensor([layout.ids]), max_new_tokens=steps,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
    assert (full - hf).abs().max().item() < 1e-5
    blend = engine.prefill(layout, BlendConfig(ratio=1.0)).logits
    assert (blend - full).abs().max().item() < 1e-5
    ours = engine.generate(layout, BlendConfig(mode="full"),
                           GenerationConfig(max_new_tokens=steps, eos_token_ids=()))
    assert ours.token_ids == ref[0, layout.num_tokens:].tolist()


def test_phi3_longrope_past_its_original_context_is_refused_by_name(engine_for):
    engine = engine_for("phi3", rope=LONGROPE, original_max_position_embeddings=ORIGINAL)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    assert layout.num_tokens > ORIGINAL
    with pytest.raises(ValueError, match=f"context of {ORIGINAL} positions.*longrope"):
        engine.prefill(layout, BlendConfig(mode="full"))
