"""The ingestion context (engine/caches/context.py) and the preview selector that reads its shifts:
stored rows are the mean over fillers, keys name the context, the exact modes stay exact."""

from __future__ import annotations

import math

import pytest
import torch

from blendrag import NO_CONTEXT, BlendConfig, ChunkContext, MemoryKVStore, PreviewOptions
from blendrag.engine.compute.observers import Trace
from blendrag.engine.selection.selectors import PreviewSelector, SelectorInputs
from blendrag.store.codec import decode, encode
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FILLERS = ("She lives in Berlin and works as an engineer.\n\n",
           "The quick brown fox jumps over the lazy dog.\n\n")
TOL = 1e-4


@pytest.fixture
def engine(engine_for):
    return engine_for("llama", context=ChunkContext(fillers=FILLERS))


def test_context_validation_and_tag():
    assert NO_CONTEXT.tag == "" and ChunkContext().tag.startswith("fill3-")
    # exact_first changes what is stored beside the entry, not the entry: same key
    assert ChunkContext(fillers=FILLERS, exact_first=False).tag == ChunkContext(FILLERS).tag
    assert ChunkContext().stores_alone and not NO_CONTEXT.stores_alone
    with pytest.raises(ValueError, match="exact_first"):
        ChunkContext(exact_first="yes")
    assert ChunkContext(fillers=FILLERS).tag == ChunkContext(fillers=list(FILLERS)).tag
    assert ChunkContext(fillers=FILLERS).tag != ChunkContext(fillers=FILLERS[::-1]).tag
    for bad in ("one string", ("ok", ""), ("ok", None)):
        with pytest.raises(ValueError, match="fillers"):
            ChunkContext(fillers=bad)


def test_stored_rows_are_the_mean_over_fillers_with_the_shift_from_alone(engine):
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ids = engine.prompts.encode(PASSAGES[1])
    got = engine.cache.kv(prefix_ids, ids)
    after = [engine.runner.compute_chunk(None, [*prefix_ids, *engine.prompts.encode(f)], ids)
             for f in FILLERS]
    alone = engine.runner.compute_chunk(None, prefix_ids, ids)
    mean_k = (after[0].keys + after[1].keys) / 2
    mean_v = (after[0].values + after[1].values) / 2
    assert torch.allclose(got.keys, mean_k, atol=TOL) and torch.allclose(got.values, mean_v,
                                                                         atol=TOL)
    shift = (mean_v - alone.values).pow(2).sum(dim=(1, 3))  # [L, T]
    assert got.context_tag == engine.context.tag and torch.allclose(got.context_shift, shift,
                                                                atol=1e-3)
    assert got.context_shift[1:].sum() > 0  # the fillers really move the rows
    assert engine.store.get(engine.key(prefix_ids, ids)) is got


def test_keys_name_the_context_and_entries_of_another_context_are_not_used(engine):
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ids = engine.prompts.encode(PASSAGES[0])
    assert engine.key(prefix_ids, ids) != engine.key(prefix_ids, ids, NO_CONTEXT)
    alone = engine.cache.kv(prefix_ids, ids, NO_CONTEXT)
    fresh = engine.cache.kv(prefix_ids, ids)  # a miss: computed in the engine's context
    assert alone.context_tag == "" and fresh.context_tag == engine.context.tag
    assert not torch.equal(alone.values, fresh.values)
    # a foreign entry planted under this context's key is refused, not served
    engine.store.put(engine.key(prefix_ids, ids), alone)
    assert engine.cache.kv(prefix_ids, ids).context_tag == engine.context.tag


def test_ingestion_stores_the_chunk_computed_alone_for_first_passages(engine, engine_for):
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ids = engine.prompts.encode(PASSAGES[1])
    engine.precompute(prefix_ids, [ids])
    alone = engine.store.get(engine.key(prefix_ids, ids, NO_CONTEXT))
    expected = engine.runner.compute_chunk(None, prefix_ids, ids)
    assert alone is not None and alone.context_tag == ""
    assert torch.allclose(alone.keys, expected.keys, atol=TOL)
    assert torch.allclose(alone.values, expected.values, atol=TOL)
    off = engine_for("llama", context=ChunkContext(fillers=FILLERS, exact_first=False))
    off.precompute(prefix_ids, [ids])
    assert off.store.get(off.key(prefix_ids, ids)) is not None
    assert off.store.get(off.key(prefix_ids, ids, NO_CONTEXT)) is None


@pytest.mark.parametrize("mode", ["reuse", "blend"])
def test_the_first_passage_takes_its_exact_rows(engine, mode):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full"))
    pre = engine.prefill(layout, BlendConfig(mode=mode, ratio=0.25))
    assert pre.stats.cache.exact_first
    lo, hi = len(layout.prefix_ids), layout.chunk_spans[1][0]
    n = layout.num_tokens
    # the first passage's rows are a full prefill's at every layer; the second's are not
    assert (pre.fused.k[:, :, lo:hi] - full.fused.k[:, :, lo:hi]).abs().max() < TOL
    assert (pre.fused.v[:, :, lo:hi] - full.fused.v[:, :, lo:hi]).abs().max() < TOL
    s1 = slice(*layout.chunk_spans[1])
    assert (pre.fused.v[:, :, s1] - full.fused.v[:, :, s1]).abs().max() > 1e-3
    assert pre.fused.length == full.fused.length == n
    # the store holds both entries of the first passage; the in-context one was not needed
    first = layout.chunk_ids[0]
    assert engine.store.get(engine.key(layout.chunk_prefix_ids, first, NO_CONTEXT)) is not None



def test_without_exact_first_the_first_passage_takes_averaged_rows(engine_for):
    off = engine_for("llama", context=ChunkContext(fillers=FILLERS, exact_first=False))
    layout = off.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = off.prefill(layout, BlendConfig(mode="full"))
    pre = off.prefill(layout, BlendConfig(mode="reuse"))
    lo, hi = len(layout.prefix_ids), layout.chunk_spans[1][0]
    assert not pre.stats.cache.exact_first
    assert (pre.fused.v[:, :, lo:hi] - full.fused.v[:, :, lo:hi]).abs().max() > 1e-3


def test_preview_never_recomputes_an_exact_first_passage(engine):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    first = layout.chunk_spans[0]
    c = layout.suffix_start - len(layout.prefix_ids)
    rest = c - (first[1] - first[0])
    trace = Trace()
    traced = engine.prefill(layout, BlendConfig(selector="preview", ratio=rest / c),
                            observers=[trace])
    # every chunk token but the first passage's is recomputed, none of the first's
    layers = engine.adapter.num_layers
    assert traced.stats.compute.recomputed_chunk_tokens_per_layer == [rest] * layers
    pos = trace.layers[0]["pos"]
    assert not bool(((pos >= first[0]) & (pos < first[1])).any())


def test_a_profile_request_does_not_store_the_exact_rows_under_the_context_key(engine):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.prefill(layout, BlendConfig(selector="profile", ratio=0.2))
    first = layout.chunk_ids[0]
    kv = engine.store.get(engine.key(layout.chunk_prefix_ids, first))
    assert kv is None or kv.context_tag == engine.context.tag


def test_context_shift_round_trips_through_the_codec(engine):
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    kv = engine.cache.kv(prefix_ids, engine.prompts.encode(PASSAGES[2]))
    key = "k" * 64
    back = decode(encode(key, kv), key)
    assert back.context_tag == kv.context_tag and torch.equal(back.context_shift, kv.context_shift)
    assert torch.equal(back.keys, kv.keys) and torch.equal(back.values, kv.values)


def test_exact_modes_stay_exact_with_a_context(engine):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    with torch.no_grad():
        hf = engine.model(torch.tensor([layout.ids])).logits[0, -1].float()
    assert (full - hf).abs().max() < TOL
    # prefix caching stores its first chunk computed after the prefix alone: still exact
    assert (engine.prefill(layout, BlendConfig(mode="prefix")).logits - full).abs().max() < TOL
    for selector in ("preview", "cacheblend", "epic", "query", "random"):
        blend = engine.prefill(layout, BlendConfig(selector=selector, ratio=1.0)).logits
        assert (blend - full).abs().max() < TOL, selector
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).logits
    assert (reuse - full).abs().max() > 1e-3  # the comparisons above are not vacuous


def test_preview_ranks_by_attention_plus_floor_times_root_shift(engine):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    chunks = [engine.cache.kv(layout.chunk_prefix_ids, ids) for ids in layout.chunk_ids]
    c = layout.suffix_start - len(layout.prefix_ids)
    layers = engine.adapter.num_layers
    attention = torch.rand(layers, c, generator=torch.Generator().manual_seed(0))
    cfg = BlendConfig(selector="preview", ratio=0.25,
                      options=PreviewOptions(attention_floor=2.0))
    sel = PreviewSelector(cfg, SelectorInputs(layout, engine.device, engine.adapter.scaling, chunks,
                                              attention))
    shift = torch.cat([kv.context_shift for kv in chunks], dim=1)
    scores = ((attention / attention.mean(dim=1, keepdim=True) + 2.0) * shift.sqrt()).sum(dim=0)
    count = math.ceil(0.25 * c)
    expected = len(layout.prefix_ids) + torch.topk(scores, count).indices.sort().values
    assert torch.equal(sel.initial(), expected)
    # without stored shifts (chunks stored alone) it ranks by attention only
    alone = [engine.cache.kv(layout.chunk_prefix_ids, ids, NO_CONTEXT)
             for ids in layout.chunk_ids]
    sel = PreviewSelector(cfg, SelectorInputs(layout, engine.device, engine.adapter.scaling, alone,
                                              attention))
    picked = sel.initial() - len(layout.prefix_ids)
    norm = (attention / attention.mean(dim=1, keepdim=True)).sum(dim=0)
    norm[: len(layout.chunk_ids[0])] = -1.0  # chunk 0 follows this very prefix: exact rows
    assert torch.equal(picked, torch.topk(norm, count).indices.sort().values)
    with pytest.raises(ValueError, match="preview pass"):
        PreviewSelector(cfg, SelectorInputs(layout, engine.device, engine.adapter.scaling, chunks))


def test_preview_pass_is_counted_in_the_compute(engine):
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    stats = engine.prefill(layout, BlendConfig(selector="preview", ratio=0.2)).stats
    n, s, layers = layout.num_tokens, len(layout.suffix_ids), engine.adapter.num_layers
    assert stats.compute.preview_tokens == s
    computed = sum(stats.compute.computed_per_layer)
    assert stats.compute_fraction == pytest.approx((computed + s * layers) / (n * layers))
    assert stats.recompute_fraction == pytest.approx(
        math.ceil(0.2 * (layout.suffix_start - len(layout.prefix_ids)))
        / (layout.suffix_start - len(layout.prefix_ids)))


def test_an_engine_without_tokenizer_cannot_take_fillers(engine):
    from blendrag import BlendEngine

    assert BlendEngine(engine.model, None, store=MemoryKVStore()).context == NO_CONTEXT
    with pytest.raises(ValueError, match="tokenizer"):
        BlendEngine(engine.model, None, context=ChunkContext(fillers=FILLERS))


def test_the_precompute_job_counts_both_entries_of_a_chunk(engine):
    from blendrag.ingest import ingest_source, kv_bytes_per_token

    summary = ingest_source(engine, [PASSAGES[0]], prefix=PREFIX, progress=False)
    tokens = len(engine.prompts.encode(PASSAGES[0]))
    assert (summary.computed, summary.tokens) == (1, tokens)
    assert summary.bytes == 2 * tokens * kv_bytes_per_token(engine)
