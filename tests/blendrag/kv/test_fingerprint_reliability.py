"""A changed model never gets the old model's stored KVs: the fingerprint
covers every byte of every weight, and weights changed in place after the engine was built are
noticed."""

from __future__ import annotations

import torch

from blendrag import BlendConfig
from blendrag.kv.keys import ModelIdentity, model_fingerprint
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

TOL = 1e-4


def _model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1024, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_changes_a_strided_sample_would_miss_change_the_fingerprint():
    base = model_fingerprint(_model())
    rows = _model()  # embedding rows past what a 4096-element sample reaches
    with torch.no_grad():
        rows.model.embed_tokens.weight[480:] += 1.0
    odd = _model()  # the odd elements of every k_proj and v_proj
    with torch.no_grad():
        for layer in odd.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.view(-1)[1::2] *= -1.0
    last = _model()  # the very last byte of the last tensor
    with torch.no_grad():
        last.lm_head.weight.view(-1)[-1] += 1e-3
    prints = {model_fingerprint(m) for m in (rows, odd, last)}
    assert base not in prints and len(prints) == 3
    assert model_fingerprint(_model()) == base  # and it stays deterministic


def test_in_place_change_is_noticed_and_the_fingerprint_recomputed():
    model = _model()
    identity = ModelIdentity(model)
    before = identity.fingerprint
    assert not identity.changed() and identity.fingerprint == before
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight.mul_(2.0)
    assert identity.changed()
    assert identity.fingerprint == model_fingerprint(model) != before
    # a replaced parameter is noticed too
    model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(
        model.model.layers[1].mlp.up_proj.weight.detach() + 1.0)
    assert identity.changed() and identity.fingerprint == model_fingerprint(model)
    # writes through .data bypass the version counter: refresh() is the documented way
    model.model.norm.weight.data.add_(1.0)
    assert not identity.changed() and identity.refresh() == model_fingerprint(model)


def test_engine_answers_with_the_changed_model_not_its_stored_kvs(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    old = engine.prefill(layout, BlendConfig(mode="prefix")).logits  # stores prefix + chunk 0
    with torch.no_grad():
        for layer in engine.model.model.layers:
            layer.self_attn.k_proj.weight.view(-1)[1::2] *= -1.0
            layer.self_attn.v_proj.weight.view(-1)[1::2] *= -1.0
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    cached = engine.prefill(layout, BlendConfig(mode="prefix"))
    assert (full - old).abs().max().item() > 1e-2  # the change matters to the answer
    assert cached.stats.cache.prefix_hit is False  # the old prefix KV was not used
    assert (cached.logits - full).abs().max().item() < TOL
