"""The history cache (engine/caches/history.py): the rows of an earlier turn found by their ids at
the
start of a later prompt's suffix, moved to their new positions and blended like a chunk; a
ratio-1.0 turn equals a full prefill, a full-mode turn never takes them."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, GenerationConfig, PromptLayout
from blendrag.engine.caches.history import HISTORY_TAG, HistoryCache
from blendrag.engine.compute.fused_kv import FusedKV
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FULL, BLEND, EXACT = BlendConfig(mode="full"), BlendConfig(ratio=0.3), BlendConfig(ratio=1.0)
MIB = 1 << 20
ANSWER = GenerationConfig(max_new_tokens=12, eos_token_ids=())


def _rows(engine: BlendEngine, tokens: int, seed: int = 0) -> FusedKV:
    """A request KV of ``tokens`` random rows, keys rotated at their positions."""
    a = engine.adapter
    g = torch.Generator().manual_seed(seed)
    fused = FusedKV(a.num_layers, a.num_kv_heads, tokens, a.head_dim, torch.float32,
                    torch.device("cpu"))
    fused.k.copy_(torch.randn(fused.k.shape, generator=g))
    fused.v.copy_(torch.randn(fused.v.shape, generator=g))
    fused.length = tokens
    return fused


def _conversation(engine: BlendEngine, config: BlendConfig):
    """Turn 1 over passages 0-1; turn 2 over passages 2-3 (retrieved again), the first turn's
    question and answer after them, then a new question: (turn 2's layout, its history
    tokens)."""
    first = engine.build_prompt(PREFIX, PASSAGES[:2], "Who scored?" + SUFFIX)
    answer = engine.generate(first, config, ANSWER)
    history = [*first.suffix_ids, *answer.token_ids]
    question = engine.prompts.encode("\nWhere was he born?" + SUFFIX)
    second = engine.build_prompt(PREFIX, PASSAGES[2:4], "x")
    return PromptLayout(second.prefix_ids, second.chunk_ids, [*history, *question],
                        second.chunk_prefix_ids), len(history)


def test_unrotate_inverts_rope_at_any_position(chat_engine):
    engine = chat_engine()
    rope = engine.runner.rope(300)
    x = torch.randn(engine.adapter.num_kv_heads, 40, engine.adapter.head_dim)
    for start in (0, 17, 250):
        at = rope.layer(0).at(slice(start, start + 40))
        assert torch.allclose(at.unrotate(at.rotate(x)), x, atol=1e-5)
    moved = rope.layer(0).at(slice(100, 140)).rotate(x)
    back = rope.layer(0).at(slice(100, 140)).unrotate(moved)
    again = rope.layer(0).at(slice(7, 47)).rotate(back)  # the same keys moved to 7
    assert torch.allclose(again, rope.layer(0).at(slice(7, 47)).rotate(x), atol=1e-5)


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 256}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 256,
            "short_factor": [1.0] * 6, "long_factor": [4.0] * 6, "factor": 16.0}


@pytest.mark.parametrize(("family", "config"), [
    ("llama", {"rope": YARN}),
    ("phi3", {"rope": LONGROPE, "partial_rotary_factor": 0.75, "positions": 4096}),
], ids=["yarn", "longrope"])
def test_history_rows_are_exact_under_ropes_that_scale_cos_and_sin(model_dir, family, config):
    """yarn and longrope multiply cos and sin by an attention factor (cos^2 + sin^2 is its
    square, not 1): un-rotation divides it out, so a later turn that takes an exact earlier
    turn's rows at their own positions equals a full prefill."""
    from blendrag.engine.caches.context import NO_CONTEXT
    from helpers.tiny import COMPUTED_FIRST

    path = model_dir(family, **config)
    engine = BlendEngine.from_pretrained(path, device="cpu", chat=False, context=NO_CONTEXT,
                                         loading=COMPUTED_FIRST, history_bytes=64 * MIB)
    plain = BlendEngine.from_pretrained(path, device="cpu", chat=False)
    table = engine.runner.rope(64).layer(0)
    x = torch.randn(2, 64, engine.adapter.head_dim)
    assert torch.allclose(table.at(slice(0, 64)).unrotate(table.at(torch.arange(64)).rotate(x)),
                          x, atol=1e-5)
    g = torch.Generator().manual_seed(5)
    prefix, chunk, said, question = (torch.randint(4, 400, (n,), generator=g).tolist()
                                     for n in (6, 30, 24, 6))
    engine.prefill(PromptLayout(prefix, [chunk], said), FULL)  # keeps the rows of ``said``
    later = PromptLayout(prefix, [chunk], [*said, *question])
    reused = engine.prefill(later, BlendConfig(mode="reuse"))
    assert reused.stats.cache.history_tokens == len(said)
    assert (reused.logits - plain.prefill(later, FULL).logits).abs().max() < 1e-4


def test_a_kept_segment_is_found_by_its_ids_and_the_newest_of_a_chat_replaces_the_older(
        chat_engine):
    engine = chat_engine()
    cache = HistoryCache(64 * MIB)
    ids = list(range(1000, 1060))
    fused = _rows(engine, 60)
    rope = engine.runner.rope(60)
    cache.keep(ids, 20, fused, rope)  # rows 20-59: the conversation
    assert len(cache) == 1
    found = cache.find([*ids[20:50], 7, 7], limit=100)
    assert found is not None and found[1:] == (0, 30)
    assert cache.find(ids[20:30], limit=100) is None  # shorter than min_tokens
    assert cache.find([5, *ids[20:50]], limit=100) is None  # the suffix must begin with it
    assert cache.find(ids[25:55], limit=100)[1:] == (5, 30)  # a run may start inside one
    layout = PromptLayout([1, 2], [[3, 4, 5]], [*ids[20:60], 9, 9])
    split, rows = cache.split(layout)
    assert split.ids == layout.ids and split.suffix_ids == (9, 9)
    assert rows.start == layout.suffix_start and rows.tokens == 40
    assert rows.kv.context_tag == HISTORY_TAG
    # the kept keys are pre-RoPE: rotated where they were, they are the request's again
    again = rope.layer(1).at(slice(20, 60)).rotate(rows.kv.keys[1])
    assert torch.allclose(again, fused.k[1, :, 20:60], atol=1e-5)
    assert torch.equal(rows.kv.values, fused.v[:, :, 20:60])
    # the next turn: the same conversation, longer; it replaces the older segment
    longer = [*ids, 5, 6, 7, 8]
    cache.keep(longer, 20, _rows(engine, 64, seed=1), engine.runner.rope(64))
    assert len(cache) == 1 and cache.find(longer[20:], limit=100)[2] == 44


def test_the_budget_evicts_the_least_recently_used_segment(chat_engine):
    engine = chat_engine()
    one = _rows(engine, 40)
    size = 2 * one.k[:, :, :40].numel() * 4
    cache = HistoryCache(2 * size)
    rope = engine.runner.rope(40)
    runs = [list(range(s, s + 40)) for s in (100, 200, 300)]
    cache.keep(runs[0], 0, one, rope)
    cache.keep(runs[1], 0, _rows(engine, 40, seed=1), rope)
    assert cache.find(runs[0], limit=40) is not None  # used: now the most recent
    cache.keep(runs[2], 0, _rows(engine, 40, seed=2), rope)
    assert cache.bytes <= 2 * size and len(cache) == 2
    assert cache.find(runs[1], limit=40) is None and cache.find(runs[0], limit=40) is not None
    with pytest.raises(ValueError, match="history cache bytes"):
        HistoryCache(-1)


def test_a_later_turn_blends_the_history_wherever_the_passages_put_it(chat_engine, one_thread):
    engine = chat_engine()
    layout, history = _conversation(engine, BLEND)
    pre = engine.prefill(layout, BLEND)
    cache = pre.stats.cache
    assert cache.history_tokens >= 0.8 * history
    assert cache.prefix_cache_tokens < len(layout.prefix_ids) + 1  # the passages changed
    computed = pre.stats.compute.computed_per_layer[-1]
    assert computed < layout.num_tokens - len(layout.prefix_ids) - history
    without = chat_engine(history_bytes=0)
    _conversation(without, BLEND)
    plain = without.prefill(layout, BLEND)
    assert plain.stats.cache.history_tokens == 0
    assert plain.stats.compute.computed_per_layer[-1] > computed + history // 2


def test_ratio_one_with_history_equals_a_full_prefill(chat_engine, one_thread):
    engine, plain = chat_engine(), chat_engine(prefix_cache_bytes=0)
    layout, history = _conversation(engine, BLEND)
    pre = engine.prefill(layout, EXACT)
    assert pre.stats.cache.history_tokens >= 0.8 * history
    ref = plain.prefill(layout, FULL)
    assert torch.allclose(pre.logits, ref.logits, atol=1e-4, rtol=0)
    n = layout.num_tokens
    assert torch.allclose(pre.fused.k[:, :, :n], ref.fused.k[:, :, :n], atol=1e-4, rtol=0)


def test_a_full_mode_turn_never_takes_history_rows(chat_engine, one_thread):
    engine, plain = chat_engine(), chat_engine(prefix_cache_bytes=0)
    layout, _ = _conversation(engine, BLEND)  # approximate rows kept from a blended turn
    for mode in ("full", "prefix"):
        pre = engine.prefill(layout, BlendConfig(mode=mode))
        assert pre.stats.cache.history_tokens == 0
        ref = plain.prefill(layout, BlendConfig(mode=mode))
        assert torch.allclose(pre.logits, ref.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("selector", ["profile", "cacheblend", "epic"])
def test_every_selector_blends_history_rows_and_none_reach_the_store(chat_engine, one_thread,
                                                                     selector):
    engine = chat_engine()
    layout, history = _conversation(engine, BLEND)
    split, rows = engine.history.split(layout)
    assert rows is not None
    pre = engine.prefill(layout, BlendConfig(selector=selector, ratio=0.3))
    assert pre.stats.cache.history_tokens == rows.tokens
    key = engine.key(split.chunk_prefix_ids, split.chunk_ids[-1])
    assert not engine.store.contains(key)  # conversation text never enters the chunk store


def test_a_history_chunk_gets_the_other_chunks_mean_prior():
    from blendrag.engine.selection.selectors import _history_filled
    from blendrag.kv.chunk_kv import ChunkKV
    from blendrag.store.layered import MemoryLayeredEntry

    def entry(tokens: int, tag: str = "") -> MemoryLayeredEntry:
        z = torch.zeros(2, 1, tokens, 4)
        return MemoryLayeredEntry(ChunkKV(z, z, tuple(range(tokens)), context_tag=tag))

    chunks = [entry(3), entry(2), entry(4, HISTORY_TAG)]
    shifts = [torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]),
              torch.tensor([[3.0, 3.0], [4.0, 4.0]]), None]
    filled = _history_filled(shifts, chunks)
    assert torch.equal(filled[2], torch.tensor([[2.0] * 4, [3.0] * 4]))  # per layer
    profiles = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([6.0, 6.0]), None]
    assert torch.equal(_history_filled(profiles, chunks)[2], torch.full((4,), 4.0))
    chunks[0] = entry(3, "")
    assert _history_filled([None, None, None], chunks) == [None, None, None]


def test_no_history_row_is_taken_after_the_weights_change_in_place(chat_engine, one_thread):
    """Rows an earlier turn computed with other weights are not the model's any more: like the
    stored chunks and the prefix cache, the history cache takes none of them."""
    engine = chat_engine()
    layout, history = _conversation(engine, BLEND)
    assert engine.prefill(layout, BLEND).stats.cache.history_tokens >= 0.8 * history
    before = engine.model_fp
    with torch.no_grad():
        for p in engine.model.parameters():
            if p.dim() == 2:
                p.mul_(1.2)
    assert engine.model_fp != before
    pre = engine.prefill(layout, BLEND)
    assert pre.stats.cache.history_tokens == 0 and pre.stats.cache.prefix_cache_tokens == 0
