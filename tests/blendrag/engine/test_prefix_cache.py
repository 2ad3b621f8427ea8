"""The prefix cache (engine/caches/prefix_cache.py): chained block hashes, the longest cached
prefix,
eviction that spares blocks in use, exact rows for exact requests only, and a full prefill's
logits when a request starts from cached rows."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, GenerationConfig, PromptLayout
from blendrag.engine.caches.prefix_cache import PrefixCache
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.store import StoreConfig, TieredKVStore
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FULL, BLEND = BlendConfig(mode="full"), BlendConfig(ratio=0.3)
MIB = 1 << 20


def _rows(tokens: int, seed: int = 0, layers: int = 2) -> FusedKV:
    """A request KV of ``tokens`` random rows."""
    g = torch.Generator().manual_seed(seed)
    fused = FusedKV(layers, 2, tokens, 4, torch.float32, torch.device("cpu"))
    fused.k.copy_(torch.randn(fused.k.shape, generator=g))
    fused.v.copy_(torch.randn(fused.v.shape, generator=g))
    fused.length = tokens
    return fused


def _cache(max_bytes: int = MIB, block: int = 8) -> PrefixCache:
    return PrefixCache(max_bytes, lambda: "model", block_tokens=block)


def test_a_blocks_hash_names_its_whole_prefix():
    cache = _cache()
    ids = list(range(40))
    chain = cache.chain(ids)
    assert len(chain) == 5 and len(set(chain)) == 5
    assert cache.chain(ids[:24]) == chain[:3]  # a prefix has the same leading blocks
    changed = [*ids[:3], 999, *ids[4:]]  # one early token changed: every later block differs
    assert not set(cache.chain(changed)) & set(chain)
    later = [*ids[:20], 999, *ids[21:]]
    assert cache.chain(later)[:2] == chain[:2] and cache.chain(later)[2] != chain[2]
    assert _cache().chain(ids) == chain  # the same root: the same chain
    assert PrefixCache(MIB, lambda: "other", block_tokens=8).chain(ids)[0] != chain[0]


def test_the_longest_cached_prefix_is_found_block_by_block():
    cache, ids = _cache(), list(range(100, 150))
    fused = _rows(50)
    cache.insert(ids, fused, exact_rows=50)
    assert len(cache) == 6  # whole blocks of 8 only
    match = cache.match(ids, exact_only=True)
    assert (match.tokens, match.exact_tokens) == (48, 48)
    cache.release(match)
    other = [*ids[:20], 7, *ids[21:]]  # differs inside block 2: blocks 0-1 match
    match = cache.match(other, exact_only=True)
    assert match.tokens == 16
    target = FusedKV(2, 2, 50, 4, torch.float32, torch.device("cpu"))
    PrefixCache.copy_into(match, target, 16)
    assert torch.equal(target.k[:, :, :16], fused.k[:, :, :16])
    assert torch.equal(target.v[:, :, :16], fused.v[:, :, :16])
    cache.release(match)


def test_eviction_keeps_the_budget_and_never_takes_a_block_in_use():
    one = 2 * 2 * 2 * 8 * 4 * 4  # bytes of a block: k and v of [2, 2, 8, 4] float32
    cache = _cache(max_bytes=3 * one)
    first = list(range(24))
    cache.insert(first, _rows(24, seed=1), exact_rows=24)
    held = cache.match(first, exact_only=True)  # a request holds the three blocks
    assert held.tokens == 24
    cache.insert(list(range(500, 524)), _rows(24, seed=2), exact_rows=24)
    assert cache.bytes <= 3 * one  # the budget kept, by the new blocks giving way
    again = cache.match(first, exact_only=True)
    assert again.tokens == 24  # the blocks in use are all there
    cache.release(again)
    cache.release(held)
    cache.insert(list(range(900, 924)), _rows(24, seed=3), exact_rows=24)
    assert cache.bytes <= 3 * one
    assert cache.match(first, exact_only=True).tokens == 0  # free now: evicted


def test_a_chains_last_blocks_go_before_its_first():
    one = 2 * 2 * 2 * 8 * 4 * 4
    cache = _cache(max_bytes=4 * one)
    ids = list(range(32))
    cache.insert(ids, _rows(32), exact_rows=32)
    cache.insert(list(range(100, 108)), _rows(8, seed=4), exact_rows=8)  # one block more
    match = cache.match(ids, exact_only=True)
    assert match.tokens == 24  # the chain kept its head: only its last block went
    cache.release(match)


def test_approximate_blocks_never_serve_exact_requests():
    cache, ids = _cache(), list(range(40))
    cache.insert(ids, _rows(40), exact_rows=16)  # blocks 0-1 exact, 2-4 approximate
    exact = cache.match(ids, exact_only=True)
    assert (exact.tokens, exact.exact_tokens) == (16, 16)
    approx = cache.match(ids, exact_only=False)
    assert (approx.tokens, approx.exact_tokens) == (40, 16)
    cache.release(exact)
    cache.release(approx)
    cache.insert(ids, _rows(40, seed=9), exact_rows=40)  # exact rows replace approximate ones
    upgraded = cache.match(ids, exact_only=True)
    assert (upgraded.tokens, upgraded.exact_tokens) == (40, 40)
    cache.release(upgraded)
    cache.insert(ids, _rows(40, seed=10), exact_rows=0)  # ... never the reverse
    assert cache.match(ids, exact_only=True).tokens == 40


def _turn(engine: BlendEngine, history: str, question: str):
    return engine.build_prompt(PREFIX, PASSAGES, history + question + SUFFIX)


def test_a_full_request_from_cached_rows_equals_a_full_prefill(chat_engine, one_thread):
    engine, plain = chat_engine(), chat_engine(prefix_cache_bytes=0)
    first = _turn(engine, "", "Who scored?")
    answer = engine.generate(first, FULL, GenerationConfig(max_new_tokens=12, eos_token_ids=()))
    # the next turn: the first turn's prompt, its answer, a new question
    question = engine.prompts.encode("\nWhere?" + SUFFIX)
    second = PromptLayout(first.prefix_ids, first.chunk_ids,
                          [*first.suffix_ids, *answer.token_ids, *question])
    pre = engine.prefill(second, FULL)
    block = engine.prefix_cache.block_tokens
    answered = first.num_tokens + len(answer.token_ids) - 1  # the last token's row is not kept
    assert pre.stats.cache.prefix_cache_tokens == answered // block * block
    assert pre.stats.cache.prefix_cache_exact is True
    assert pre.stats.compute.computed_per_layer[0] == second.num_tokens - answered // block * block
    ref = plain.prefill(second, FULL)
    assert ref.stats.cache.prefix_cache_tokens == 0
    assert (pre.logits - ref.logits).abs().max() < 1e-5
    assert pre.stats.to_dict()["prefix_cache_tokens"] == pre.stats.cache.prefix_cache_tokens


def test_blend_rows_are_approximate_and_full_requests_do_not_take_them(chat_engine, one_thread):
    engine = chat_engine()
    layout = _turn(engine, "", "Who scored?")
    engine.prefill(layout, BLEND)  # the prefix's blocks exact, the rest approximate
    full = engine.prefill(layout, FULL)
    taken = full.stats.cache.prefix_cache_tokens
    assert taken <= len(layout.prefix_ids) and full.stats.cache.prefix_cache_exact in (None, True)
    again = engine.prefill(layout, BLEND)  # blend takes everything but the last token's block
    assert again.stats.cache.prefix_cache_tokens >= layout.num_tokens - 32
    assert again.stats.cache.prefix_cache_exact is True  # the full request's exact rows
    blend_only = chat_engine()
    blend_only.prefill(layout, BLEND)
    approx = blend_only.prefill(layout, BLEND)
    assert approx.stats.cache.prefix_cache_exact is False


def test_blocks_in_the_store_serve_another_engine(chat_engine, tmp_path, one_thread):
    # the store's default format (bfloat16): exact rows are still stored exactly
    config = StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", disk_bytes=256 * MIB)
    writer = chat_engine(store=TieredKVStore(config), prefix_cache_store=True)
    layout = _turn(writer, "", "Who scored?")
    writer.prefill(layout, FULL)
    reader = chat_engine(store=TieredKVStore(config), prefix_cache_store=True)  # a new process
    pre = reader.prefill(layout, FULL)
    assert pre.stats.cache.prefix_cache_tokens >= layout.num_tokens - 32
    assert pre.stats.cache.prefix_cache_exact is True
    ref = chat_engine(prefix_cache_bytes=0).prefill(layout, FULL)
    assert (pre.logits - ref.logits).abs().max() < 1e-5


def test_prefix_cache_settings_are_checked():
    with pytest.raises(ValueError, match="prefix cache bytes"):
        PrefixCache(-1, lambda: "m")
    with pytest.raises(ValueError, match="block_tokens"):
        PrefixCache(MIB, lambda: "m", block_tokens=0)


def _small_blocks(engine: BlendEngine, block: int = 4) -> BlendEngine:
    """``engine`` with a prefix cache of ``block``-token blocks (shared runs land on blocks)."""
    engine.prefix_cache = PrefixCache(64 * MIB, lambda: engine.cache.identity.fingerprint,
                                      block_tokens=block)
    return engine


def _two_prompts(engine: BlendEngine):
    """Two prompts that share the prefix and the first passage, then differ."""
    a = engine.build_prompt(PREFIX, PASSAGES[:2], SUFFIX)
    b = engine.build_prompt(PREFIX, [PASSAGES[0], PASSAGES[2]], "\nQuestion: where?\nAnswer:")
    return a, b


@pytest.mark.parametrize("config", [BlendConfig(mode="reuse"), BlendConfig(ratio=1.0)],
                         ids=["reuse", "blend-1.0"])
def test_blend_after_cached_rows_reuses_them_up_to_a_chunk_boundary(chat_engine, config,
                                                                    one_thread):
    from blendrag.engine.caches.context import NO_CONTEXT

    engine = _small_blocks(chat_engine(context=NO_CONTEXT))
    plain = chat_engine(prefix_cache_bytes=0, context=NO_CONTEXT)
    a, b = _two_prompts(engine)
    engine.prefill(a, FULL)  # exact rows of the prefix and the first passage
    pre = engine.prefill(b, config)
    if config.mode == "blend":  # at 1.0 it computes more than the exact path: that runs
        choice = pre.stats.controller.mode
        assert pre.stats.mode == "full" and choice.reason.startswith("exact prefix cache")
        full = plain.prefill(b, FULL)
        assert (pre.logits - full.logits).abs().max() < 1e-5
        return
    first_end = b.chunk_spans[0][1]
    taken, bridged = pre.stats.cache.prefix_cache_tokens, pre.stats.compute.bridged_tokens
    # the blocks stop inside the first passage: its last tokens computed after them
    assert taken % 4 == 0 and taken + bridged == first_end and 0 < bridged < 4
    assert pre.stats.cache.prefix_cache_exact is True
    assert (pre.stats.cache.chunk_hits, pre.stats.cache.chunk_misses) == (0, 1)  # passage 3 only
    ref = plain.prefill(b, config)
    # reuse: the first passage's rows computed after the prefix either way (NO_CONTEXT);
    # blend at 1.0: every chunk token recomputed, i.e. a full prefill's rows
    assert (pre.logits - ref.logits).abs().max() < 1e-5


def test_a_partial_blend_after_cached_rows_blends_only_the_chunks_after_them(chat_engine,
                                                                             one_thread):
    engine = _small_blocks(chat_engine())
    a, b = _two_prompts(engine)
    engine.prefill(a, FULL)
    pre = engine.prefill(b, BLEND)
    first_end, n = b.chunk_spans[0][1], b.num_tokens
    computed = pre.stats.compute.computed_per_layer
    # the first layer computes some of passage 3's tokens and the suffix, nothing before
    second = b.chunk_spans[1][1] - b.chunk_spans[1][0]
    assert n - b.suffix_start <= computed[0] <= n - b.suffix_start + second
    assert pre.stats.cache.prefix_cache_tokens + pre.stats.compute.bridged_tokens == first_end
    assert pre.exact_rows == first_end  # the cached rows were exact, the blended ones are not
    assert torch.isfinite(pre.logits).all()


def test_prefix_mode_takes_only_exact_rows_past_its_chunk(chat_engine, one_thread):
    engine = _small_blocks(chat_engine())
    a, _ = _two_prompts(engine)
    engine.prefill(a, BLEND)  # approximate rows past the prefix
    pre = engine.prefill(a, BlendConfig(mode="prefix"))
    assert pre.stats.cache.prefix_cache_tokens == 0  # the exact ones stop inside passage 1
    ref = chat_engine(prefix_cache_bytes=0).prefill(a, BlendConfig(mode="prefix"))
    assert (pre.logits - ref.logits).abs().max() < 1e-5


def test_rows_covering_less_than_half_a_passage_are_cut_back_to_its_start(chat_engine,
                                                                          one_thread):
    engine = _small_blocks(chat_engine(), block=4)
    a, b = _two_prompts(engine)
    start, end = b.chunk_spans[0]
    # a first request that shares the prefix and only the passage's first few tokens
    short = PromptLayout(a.prefix_ids, [a.chunk_ids[0][:6]], a.suffix_ids, a.chunk_prefix_ids)
    engine.prefill(short, FULL)
    pre = engine.prefill(b, BLEND)
    cached = (start + 6) // 4 * 4
    assert start < cached < (start + end) / 2  # blocks stop in the passage's first half
    assert pre.stats.cache.prefix_cache_tokens == start  # cut back to the prefix
    assert pre.stats.compute.bridged_tokens == 0
    assert (pre.stats.cache.chunk_hits + pre.stats.cache.chunk_misses) == 2


def test_hit_chunks_are_numbered_in_the_whole_layout_after_a_head(chat_engine, one_thread):
    """The chunks the head takes whole are not looked up; the ones after it keep their own
    index in the request's layout (what a framework's passage count reads)."""
    engine = _small_blocks(chat_engine())
    a, b = _two_prompts(engine)
    engine.ingest(PASSAGES[:3], PREFIX)
    engine.prefill(a, FULL)
    pre = engine.prefill(b, BLEND)
    assert pre.stats.cache.prefix_cache_tokens >= b.chunk_spans[0][1] - 4  # passage 1 cached
    assert pre.stats.cache.hit_chunks == [1]  # passage 3, second in b, read from the store


def test_a_cached_mode_runs_the_exact_path_when_it_computes_no_more(chat_engine, one_thread):
    """A chat's next turn after an exact turn: the prefix cache holds the whole earlier prompt
    and answer exactly, so a full prefill computes only the new question; blend would compute
    as much or more (its preview pass, its ratio of the chunks after its own head)."""
    engine = chat_engine()
    a, _ = _two_prompts(engine)
    turn = engine.build_prompt(PREFIX, PASSAGES[:2],
                               SUFFIX + " Paris.\nQuestion: and then?\nAnswer:")
    engine.prefill(a, FULL)  # exact rows of the whole first prompt
    pre = engine.prefill(turn, BlendConfig(selector="preview", ratio=0.2))
    choice = pre.stats.controller.mode
    assert pre.stats.mode == "full" and choice.ran == "full"
    assert choice.reason.startswith("exact prefix cache")
    plain = chat_engine(prefix_cache_bytes=0)
    assert (pre.logits - plain.prefill(turn, FULL).logits).abs().max() < 1e-5


def _hf(engine: BlendEngine, layout: PromptLayout) -> torch.Tensor:
    with torch.no_grad():
        return engine.model(torch.tensor([layout.ids])).logits[0, -1].float()


def test_a_prefix_over_approximate_blocks_is_not_kept_as_exact(chat_engine, one_thread):
    """A request whose prompt prefix lies under an earlier turn's approximate blocks claims
    none of them exact: the blocks stay approximate, and a later full prefill computes them
    (it was 0.14 off HF's logits when they were kept as exact)."""
    from blendrag.engine.caches.context import NO_CONTEXT

    engine = chat_engine(context=NO_CONTEXT, history_bytes=0)
    first = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.prefill(first, BlendConfig(mode="reuse"))  # approximate blocks past the prefix
    # the same ids, cut so that the first passages are the prompt's prefix
    p, chunks, s = first.prefix_ids, first.chunk_ids, first.suffix_ids
    second = PromptLayout([*p, *chunks[0], *chunks[1]], [chunks[2]], [*chunks[3], *s])
    assert second.ids == first.ids
    pre = engine.prefill(second, BlendConfig(mode="reuse"))
    assert pre.stats.cache.prefix_cache_exact is False
    assert pre.exact_rows < len(p) + len(chunks[0])  # not the whole prefix
    full = engine.prefill(first, FULL)
    assert full.stats.cache.prefix_cache_tokens <= len(p)
    assert (full.logits - _hf(engine, first)).abs().max() < 1e-4


@pytest.mark.parametrize("selector", ["preview", "cacheblend", "epic"])
def test_blend_at_ratio_one_after_an_approximate_turn_is_a_full_prefill(chat_engine, selector,
                                                                        one_thread):
    """Ratio 1.0 recomputes every chunk token: it takes no earlier turn's approximate blocks
    either, so its logits are a full prefill's (0.37 off them before)."""
    from blendrag.engine.caches.context import NO_CONTEXT

    engine = chat_engine(context=NO_CONTEXT, history_bytes=0)
    first = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    answer = engine.generate(first, BlendConfig(ratio=0.2),
                             GenerationConfig(max_new_tokens=8, eos_token_ids=()))
    question = engine.prompts.encode("\nQuestion: where?\nAnswer:")
    second = PromptLayout(first.prefix_ids, first.chunk_ids,
                          [*first.suffix_ids, *answer.token_ids, *question])
    pre = engine.prefill(second, BlendConfig(selector=selector, ratio=1.0), as_asked=True)
    assert pre.stats.cache.prefix_cache_exact in (None, True)
    assert (pre.logits - _hf(engine, second)).abs().max() < 1e-4
