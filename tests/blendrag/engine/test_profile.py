"""Context-sensitivity profiles: measured at ingestion (or on first use), stored with the chunk
KV, and the profile selector recomputes the top tokens by them."""

from __future__ import annotations

import math

import pytest
import torch

from blendrag import BlendConfig
from blendrag.config import profile_depth
from blendrag.engine.caches.profile import key_deviation, neighbours, profiled
from blendrag.engine.selection.selectors import make_selector
from blendrag.kv.chunk_kv import ChunkKV
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, computed


def _kv(keys: torch.Tensor) -> ChunkKV:
    return ChunkKV(keys, torch.zeros_like(keys), tuple(range(keys.shape[2])))


def test_key_deviation_is_the_squared_key_distance_summed_over_layers_and_heads():
    alone = torch.zeros(2, 2, 3, 4)  # [L, H, T, D]
    after = alone.clone()
    after[0, 0, 1] = 1.0  # token 1: 4 x 1^2 in layer 0, head 0
    after[1, 1, 1, 0] = 2.0  # token 1: + 2^2 in layer 1, head 1
    after[1, 0, 2, :2] = 3.0  # token 2: 2 x 3^2
    dev = key_deviation(_kv(alone), _kv(after))
    assert dev.tolist() == [0.0, 8.0, 18.0]
    assert _kv(alone).values.abs().sum() == 0  # values play no part


def test_key_deviation_refuses_different_chunks():
    a = _kv(torch.zeros(1, 1, 3, 2))
    b = ChunkKV(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), (7, 8, 9))
    with pytest.raises(ValueError, match="same chunk"):
        key_deviation(a, b)


def test_neighbours_are_the_previous_chunks_cyclically_nearest_first_never_itself():
    chunks = [[1], [2], [3]]
    assert [neighbours(chunks, i) for i in range(3)] == [[[3]], [[1]], [[2]]]
    assert neighbours(chunks, 0, 2) == [[3], [2]] and neighbours(chunks, 2, 2) == [[2], [1]]
    assert neighbours(chunks, 1, 5) == [[1], [3]]  # at most the other chunks
    assert neighbours([[1]], 0, 3) == [] and neighbours(chunks, 1, 0) == []


def test_profile_depth_reads_bools_and_counts_and_refuses_the_rest():
    assert [profile_depth(p) for p in (False, True, 0, 1, 3)] == [0, 1, 0, 1, 3]
    for bad in (-1, 1.5, "2", None):
        with pytest.raises(ValueError, match="profile must be"):
            profile_depth(bad)


def test_profile_must_have_one_value_per_token():
    with pytest.raises(ValueError, match="profile must be"):
        ChunkKV(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), (1, 2, 3),
                profile=torch.zeros(4))


def _ingest(engine, layout, profile=True):
    return engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids, profile=profile)


def test_precompute_stores_the_deviation_after_the_previous_chunk(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    _ingest(engine, layout)
    anchor = list(layout.chunk_prefix_ids)
    ids = layout.chunk_ids
    for i in range(len(ids)):
        stored = engine.store.get(engine.key(anchor, ids[i]))
        alone = engine.runner.compute_chunk(None, anchor, ids[i])
        after = engine.runner.compute_chunk(None, anchor + list(ids[i - 1]), ids[i])
        # the served KV is the stand-alone one
        assert torch.allclose(stored.keys, alone.keys, atol=1e-5)
        assert torch.allclose(stored.profile, key_deviation(alone, after), rtol=1e-3, atol=1e-4)
        assert stored.profile.max() > 0


def test_profile_selector_takes_the_top_tokens_across_chunks_but_not_the_exact_first(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    _ingest(engine, layout)
    kvs = [engine.store.get(engine.key(layout.chunk_prefix_ids, ids)) for ids in layout.chunk_ids]
    profiles = [kv.profile for kv in kvs]
    cfg = BlendConfig(selector="profile", ratio=0.3)
    sel = make_selector(cfg, layout, engine.adapter.num_layers, engine.device,
                        engine.adapter.scaling, kvs)
    picked = sel.initial()
    first_end = layout.chunk_spans[0][1]
    scores = torch.cat(profiles)
    scores[: first_end - len(layout.prefix_ids)] = -1.0
    count = math.ceil(0.3 * (layout.suffix_start - len(layout.prefix_ids)))
    expected = len(layout.prefix_ids) + torch.topk(scores, count).indices.sort().values
    assert torch.equal(picked, expected)
    assert picked.min() >= first_end  # chunk 0 follows the prefix it was computed after: exact
    # static: the same tokens at every layer, and that is the compute
    stats = engine.prefill(layout, cfg).stats
    assert stats.compute.recomputed_chunk_tokens_per_layer == [count] * engine.adapter.num_layers


def test_profile_selector_needs_a_profile_per_chunk(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with pytest.raises(ValueError, match="profile"):
        make_selector(BlendConfig(selector="profile"), layout, engine.adapter.num_layers,
                      engine.device,
                      engine.adapter.scaling, [computed(engine, (), ids)
                                               for ids in layout.chunk_ids])


def test_profile_at_ratio_one_equals_full_prefill(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    _ingest(engine, layout)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    blend = engine.prefill(layout, BlendConfig(selector="profile", ratio=1.0)).logits
    assert torch.allclose(blend, full, atol=1e-4, rtol=1e-4)


def test_chunks_stored_without_a_profile_get_one_on_first_use(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    _ingest(engine, layout, profile=False)
    cfg = BlendConfig(selector="profile", ratio=0.2)
    first = engine.prefill(layout, cfg)
    assert first.stats.cache.profiles_computed == len(PASSAGES)
    assert first.stats.cache.chunk_hits == len(PASSAGES)
    second = engine.prefill(layout, cfg)
    assert second.stats.cache.profiles_computed == 0
    assert torch.equal(first.logits, second.logits)
    # the same rule as at ingestion: measured after the previous chunk of the prompt
    fresh = engine_for("llama")
    _ingest(fresh, layout, profile=True)
    assert torch.allclose(fresh.prefill(layout, cfg).logits, second.logits, atol=1e-5)


def test_profile_recompute_brings_the_output_closer_to_full_than_reuse(engine_for):
    engine = engine_for("llama", layers=4)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    _ingest(engine, layout)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits.log_softmax(-1)

    def kl(cfg):
        p = engine.prefill(layout, cfg).logits.log_softmax(-1)
        return float((full.exp() * (full - p)).sum())

    reuse = kl(BlendConfig(mode="reuse"))
    at_half = kl(BlendConfig(selector="profile", ratio=0.5))
    assert at_half < reuse


def test_precompute_refuses_empty_chunks_by_index(engine_for):
    engine = engine_for("llama")
    with pytest.raises(ValueError, match=r"chunks \[1\] have no tokens"):
        engine.precompute([1], [[5, 6], []])


def test_profile_uses_the_cached_prefix_and_matches_a_plain_recompute(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    anchor, ids = list(layout.chunk_prefix_ids), layout.chunk_ids
    alone = engine.runner.compute_chunk(None, anchor, ids[1])
    with_cache = profiled(engine.runner, alone, anchor, [ids[0]], engine.cache.prefix(anchor))
    plain = key_deviation(alone, engine.runner.compute_chunk(None, anchor + list(ids[0]), ids[1]))
    assert torch.allclose(with_cache.profile, plain, rtol=1e-3, atol=1e-4)


def test_profile_k_keeps_each_tokens_largest_deviation_over_its_k_predecessors(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids, profile=2)
    anchor, ids = list(layout.chunk_prefix_ids), layout.chunk_ids
    for i in range(len(ids)):
        alone = engine.runner.compute_chunk(None, anchor, ids[i])
        after = [engine.runner.compute_chunk(None, anchor + list(ids[(i - j) % len(ids)]), ids[i])
                 for j in (1, 2)]
        devs = [key_deviation(alone, kv) for kv in after]
        expected = torch.maximum(devs[0], devs[1])
        got = engine.store.get(engine.key(anchor, ids[i])).profile
        assert torch.allclose(got, expected, rtol=1e-3, atol=1e-4)
        assert not torch.allclose(devs[0], devs[1])  # the two neighbours really differ
    # profile=1 is profile=True
    one = engine_for("llama")
    one.precompute(anchor, ids, profile=1)
    true = engine_for("llama")
    true.precompute(anchor, ids, profile=True)
    for c in ids:
        assert torch.equal(one.store.get(one.key(anchor, c)).profile,
                           true.store.get(true.key(anchor, c)).profile)


def test_profiled_refuses_no_probe_and_empty_probes(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    anchor = list(layout.chunk_prefix_ids)
    alone = engine.runner.compute_chunk(None, anchor, layout.chunk_ids[0])
    for probes in ([], [[]]):
        with pytest.raises(ValueError, match="probe"):
            profiled(engine.runner, alone, anchor, probes)
    with pytest.raises(ValueError, match="profile must be"):
        engine.precompute(anchor, layout.chunk_ids, profile=-2)
