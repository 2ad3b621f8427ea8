"""Keys stored before RoPE and rotated to new positions equal keys computed there (§2)."""

from __future__ import annotations

import pytest
import torch

from blendrag.model.rope import RopeTable
from helpers.tiny import PASSAGES, PREFIX

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
}


# A short chunk is computed after the cached prefix rows; one over 4x the prefix recomputes
# the prefix with it (engine._chunk_prefill): both paths must give the same rows.
CHUNKS = {"after-cached-prefix": PASSAGES[1], "prefix-recomputed": "".join(PASSAGES)}


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("shift", [0, 37, 300])
@pytest.mark.parametrize("chunk", list(CHUNKS))
def test_stored_keys_rotate_to_keys_computed_at_new_positions(engine_for, rope, shift, chunk):
    engine = engine_for("llama", rope=ROPES[rope])
    prefix_ids = engine.prompts.encode(PREFIX, first=True)
    chunk_ids = engine.prompts.encode(CHUNKS[chunk])
    assert (4 * len(prefix_ids) <= len(chunk_ids)) == (chunk == "prefix-recomputed")
    stored = engine.cache.kv(prefix_ids, chunk_ids)  # computed at positions [P, P+T)

    ids = torch.tensor([prefix_ids + chunk_ids])
    p, n = len(prefix_ids), ids.shape[1]
    with torch.no_grad():  # HF computes the same tokens at positions shifted by `shift`
        out = engine.model(ids, position_ids=torch.arange(n)[None] + shift, use_cache=True)
    table = RopeTable(engine.adapter.rotary, n + shift, engine.dtype, engine.device)
    for layer in range(engine.adapter.num_layers):
        hf_keys = out.past_key_values.layers[layer].keys[0, :, p:]  # [Hkv, T, D] post-RoPE
        ours = table.rotate(stored.keys[layer], slice(p + shift, n + shift))
        assert (ours - hf_keys).abs().max().item() < 1e-4
        assert (
            stored.values[layer] - out.past_key_values.layers[layer].values[0, :, p:]
        ).abs().max() < 1e-4


def test_keys_are_really_stored_pre_rope(engine_for):
    """Rotating at the wrong positions must not match: the test above is not vacuous."""
    engine = engine_for("llama")
    prefix_ids = engine.prompts.encode(PREFIX, first=True)
    chunk_ids = engine.prompts.encode(PASSAGES[0])
    stored = engine.cache.kv(prefix_ids, chunk_ids)
    ids = torch.tensor([prefix_ids + chunk_ids])
    with torch.no_grad():
        out = engine.model(ids, use_cache=True)
    p, n = len(prefix_ids), ids.shape[1]
    table = RopeTable(engine.adapter.rotary, n + 5, engine.dtype, engine.device)
    hf_keys = out.past_key_values.layers[1].keys[0, :, p:]
    assert (table.rotate(stored.keys[1], slice(p, n)) - hf_keys).abs().max() < 1e-4
    assert (table.rotate(stored.keys[1], slice(p + 5, n + 5)) - hf_keys).abs().max() > 1e-2
