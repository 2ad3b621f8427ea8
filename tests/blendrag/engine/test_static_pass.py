"""Cached passes of fixed shape (engine/compute/static_pass.py), run eagerly on the CPU: the
logits of the layer loop in every mode that takes them, for every family's attention and RoPE;
padded tokens never reach a real row; the counts of the stats unchanged; what does not take a
static pass runs the layer loop."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, ComputeConfig, GenerationConfig
from blendrag.config import Ape
from blendrag.engine.caches.context import ChunkContext
from blendrag.engine.compute import layer_feed, static_pass
from blendrag.engine.compute.buckets import TOKEN_BUCKETS, ladder, row_bucket, token_bucket
from blendrag.engine.compute.observers import LayerCounts, LayerStep, PhaseClock
from blendrag.engine.compute.static_pass import StaticPasses
from helpers.host_reads import MADE_ON_DEVICE, HostReads
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

STATIC = ComputeConfig(passes="graph")
LOOP = ComputeConfig(passes="eager")
# the modes whose main pass is a static one: fewer than half the tokens computed, no check
# layers (CacheBlend's selector has them)
TAKEN = (BlendConfig(mode="reuse"), BlendConfig(), BlendConfig(selector="epic", ratio=0.3),
         BlendConfig(ratio=0.4))
FAMILIES = {"llama": {}, "mistral": {"sliding_window": 24}, "qwen3": {}, "gemma2": {},
            "gemma3": {}, "phi3": {}, "olmo2": {}}


def test_a_static_pass_reads_its_counts_back_only_when_they_are_read():
    """On CUDA reading them right after the pass would make the host wait for the pass before
    it queues the logits: they are read with the request's stats, after its last sync."""
    counts, reads = LayerCounts((2, 6)), HostReads()
    with reads:
        counts.count_pass(torch.arange(8), [None, 4, None])
    assert sum(reads.count.values()) == 0
    # a layer of the layer loop after it: its counts follow the pass's, in layer order
    pos = torch.tensor([5, 7])
    counts.on_layer(LayerStep(3, pos, torch.empty(0), pos, torch.empty(0), torch.empty(0), 13,
                              None))
    assert counts.computed == [8, 8, 8, 2]
    assert counts.chunk_computed == [4, 4, 4, 1]  # positions 2..5 are chunk tokens
    assert counts.attended_keys == [36, 26, 36, 13]  # window 4: 1 + 2 + 3 + 4 x 5


def test_the_default_queues_its_blend_pass_behind_its_preview_with_nothing_read_back(
        engine_for, monkeypatch):
    """On a GPU a value read back between the preview pass and the blend pass makes the host
    wait for the preview before it queues the blend pass: the preview's attention, the
    selection over it and the blend pass's inputs stay on the device, and the counts are read
    with the stats, after the logits. ``torch.tensor(..., device=...)`` counts as a read: on
    CUDA torch synchronizes after its blocking copy. The chunks carry their ingestion context,
    so the selection's stored priors are sent too."""
    engine = engine_for("llama", compute=STATIC, context=ChunkContext())
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    first = engine.prefill(layout, BlendConfig())  # warm: the chunks stored, the buffers made
    logits, keys = first.logits, first.stats.compute.preview_attended_keys
    del first  # the pooled buffer free again: static passes run on it only
    reads, passes = HostReads(made=True), engine.runner.static_passes
    run = passes.run

    def marked(*args, **kwargs):
        reads.log.append("pass")
        return run(*args, **kwargs)

    monkeypatch.setattr(passes, "run", marked)
    with reads:
        got = engine.prefill(layout, BlendConfig())
    marks = [i for i, name in enumerate(reads.log) if name == "pass"]
    assert len(marks) == 2, reads.log  # the preview pass and the blend pass, both static
    assert reads.log[:marks[0]] == []
    assert reads.log[marks[0] + 1:marks[1]] == [], reads.log  # nothing between the passes
    assert MADE_ON_DEVICE not in reads.log
    # the same choice and the same figures as before
    assert torch.equal(got.logits, logits)
    assert got.stats.compute.preview_attended_keys == keys > 0


def test_host_inputs_go_pinned_and_non_blocking_or_plainly_without_locked_memory(monkeypatch):
    """``layer_feed.to_device`` on CUDA: a host tensor pinned, then copied non-blocking; with
    no page-locked memory to be had (a container's limit), the plain blocking copy: the same
    values, never a failed request. Stand-ins for the CUDA calls (no CUDA here)."""
    cuda, copies = torch.device("cuda"), []

    def to(self, *args, **kwargs):
        copies.append((self.tag, args, kwargs))
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    host = torch.arange(3)
    host.tag = "host"

    def pinned(self):
        out = self.clone()
        out.tag = "pinned"
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", pinned)
    layer_feed.to_device(host, cuda)
    assert copies == [("pinned", (cuda,), {"non_blocking": True})]
    copies.clear()

    def refused(self):
        raise RuntimeError("cudaHostAlloc: out of memory")

    monkeypatch.setattr(torch.Tensor, "pin_memory", refused)
    layer_feed.to_device(host, cuda)
    assert copies == [("host", (cuda,), {})]


def test_buckets():
    assert [token_bucket(a) for a in (1, 16, 17, 128, 129, 500, 512, 513, 2048)] == \
        [16, 16, 32, 128, 160, 512, 512, 640, 2048]
    assert token_bucket(2049) is None
    assert list(TOKEN_BUCKETS) == sorted(set(TOKEN_BUCKETS))
    for n in (1, 15, 16, 100, 511, 512, 3000, 3071, 3072, 16000):
        rows = row_bucket(n, 1 << 20)
        assert rows == ladder(n + 1) and n < rows <= max(n + 16, 1.25 * (n + 1)), (n, rows)
    assert row_bucket(3000, 3001) == 3001  # cut by the capacity, past the prompt
    assert row_bucket(3000, 3000) is None  # no row left for the padding
    # few shapes: prompts of 3,072 to 3,583 tokens share one bucket
    assert {row_bucket(n, 1 << 20) for n in range(3072, 3584)} == {3584}
    assert all(ladder(r) >= r and ladder(ladder(r)) == ladder(r) for r in range(1, 5000))


def test_request_kvs_take_the_ladders_sizes(engine_for):
    static, loop = _pair(engine_for, "llama")
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    a = static.prefill(layout, BlendConfig(mode="reuse"), extra_capacity=5)
    b = loop.prefill(layout, BlendConfig(mode="reuse"), extra_capacity=5)
    n = layout.num_tokens
    assert b.fused.capacity == n + 5 == loop.runner.rows_for(n + 5)
    assert a.fused.capacity == ladder(n + 6) == static.runner.rows_for(n + 5) > n + 5


def _pair(engine_for, family, **kw):
    return (engine_for(family, compute=STATIC, **kw), engine_for(family, compute=LOOP, **kw))


def _counted(engine):
    passes = engine.runner.static_passes
    return 0 if passes is None else passes.shapes


def _ran(engine):
    return engine.runner.static_passes.ran


@pytest.mark.parametrize("family", list(FAMILIES))
def test_static_passes_give_the_layer_loops_logits(engine_for, family):
    static, loop = _pair(engine_for, family, **FAMILIES[family])
    assert static.runner.static_passes is not None and loop.runner.static_passes is None
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for config in TAKEN:
        before, ran = _counted(static), _ran(static)
        a, b = static.prefill(layout, config), loop.prefill(layout, config)
        # its main pass ran as a static one (and the default's preview pass too)
        previewed = bool(a.stats.compute.preview_tokens)
        assert _ran(static) == ran + 1 + previewed, config.label
        assert previewed == ("preview" in config.label)
        assert torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0), \
            (config.label, (a.logits - b.logits).abs().max())
        assert _counted(static) >= max(before, 1)
        # what the stats count is what the layer loop counts
        ca, cb = a.stats.compute, b.stats.compute
        assert ca.computed_per_layer == cb.computed_per_layer, config.label
        assert ca.recomputed_chunk_tokens_per_layer == cb.recomputed_chunk_tokens_per_layer
        assert ca.attended_keys_per_layer == cb.attended_keys_per_layer
        assert ca.preview_attended_keys == cb.preview_attended_keys, config.label
        # and the request KV's rows, which decoding reads next
        n = layout.num_tokens
        assert torch.allclose(a.fused.k[:, :, :n], b.fused.k[:, :, :n], atol=1e-5, rtol=0)
        assert torch.allclose(a.fused.v[:, :, :n], b.fused.v[:, :, :n], atol=1e-5, rtol=0)
        del a, b  # the pooled buffer free again: static passes run on it only


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_explicit_pass_attention_gives_the_layer_loops_logits(engine_for, monkeypatch, family):
    """``pass_attention="explicit"``: the passes' attention as probabilities and a GEMM (a
    sliding window, Gemma 2's soft cap), the logits and rows of the layer loop; a pass of more
    than ``EXPLICIT_TOKENS`` tokens keeps the kernel."""
    explicit = engine_for(family, compute=ComputeConfig(passes="graph",
                                                        pass_attention="explicit"),
                          **FAMILIES[family])
    loop = engine_for(family, compute=LOOP, **FAMILIES[family])
    calls: list[bool] = []
    real = static_pass.attend_scored

    def spy(*args, **kwargs):
        calls.append(kwargs.get("summed", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(static_pass, "attend_scored", spy)
    layout = explicit.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for config in TAKEN:
        calls.clear()
        a, b = explicit.prefill(layout, config), loop.prefill(layout, config)
        assert False in calls, config.label  # the main pass's attention, computed explicitly
        assert torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0), \
            (config.label, (a.logits - b.logits).abs().max())
        n = layout.num_tokens
        assert torch.allclose(a.fused.k[:, :, :n], b.fused.k[:, :, :n], atol=1e-5, rtol=0)
        del a, b
    # a pass over the bound keeps the kernel (here every pass: the bound below the least bucket)
    monkeypatch.setattr(static_pass, "EXPLICIT_TOKENS", TOKEN_BUCKETS[0] - 1)
    calls.clear()
    got = explicit.prefill(layout, BlendConfig(mode="reuse"))
    assert calls == [] and explicit.runner.static_passes.ran
    assert torch.allclose(got.logits, loop.prefill(layout, BlendConfig(mode="reuse")).logits,
                          atol=1e-5, rtol=0)


def test_bad_pass_attention_is_refused():
    with pytest.raises(ValueError, match="pass_attention"):
        ComputeConfig(pass_attention="fast")


def test_decoding_after_a_static_pass_is_the_same(engine_for):
    static, loop = _pair(engine_for, "llama")
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for config in (BlendConfig(mode="reuse"), BlendConfig()):
        runs = [e.generate(layout, config, GenerationConfig(max_new_tokens=8))
                for e in (static, loop)]
        assert runs[0].token_ids == runs[1].token_ids


def test_padded_tokens_never_reach_a_real_row(engine_for):
    """The padding writes only the bucket's last row, past the prompt: garbage planted in every
    row past the prompt beforehand changes no logit, and the rows before it are the loop's."""
    static, loop = _pair(engine_for, "llama")
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    config = BlendConfig(mode="reuse")
    static.prefill(layout, config)  # the chunks stored
    n = layout.num_tokens
    clean = static.prefill(layout, config, extra_capacity=40)
    clean_logits, clean_k = clean.logits.clone(), clean.fused.k[:, :, :n].clone()
    del clean
    dirty = static.prefill(layout, config, extra_capacity=40)
    k, v = dirty.fused.base
    k[:, :, n:].normal_(std=50)
    v[:, :, n:].normal_(std=50)
    del dirty
    again = static.prefill(layout, config, extra_capacity=40)
    assert torch.allclose(again.logits, clean_logits, atol=1e-5, rtol=0)
    assert torch.equal(again.fused.k[:, :, :n], clean_k)
    reference = loop.prefill(layout, config, extra_capacity=40)
    assert torch.allclose(again.logits, reference.logits, atol=1e-5, rtol=0)


def test_what_does_not_take_a_static_pass_runs_the_layer_loop(engine_for):
    """CacheBlend's check layers, APE, passes of half the prompt or more (prefix mode's tail,
    a full prefill) and timed requests run the loop: the same logits as the loop, and no
    static pass run for them."""
    static, loop = _pair(engine_for, "llama")
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for config in (BlendConfig(mode="reuse"),):  # chunks stored, a shape made
        static.prefill(layout, config)
    ran = _ran(static)
    for config in (BlendConfig(selector="cacheblend", ratio=0.3),
                   BlendConfig(mode="reuse", ape=Ape()), BlendConfig(mode="prefix"),
                   BlendConfig(mode="full")):
        a, b = static.prefill(layout, config), loop.prefill(layout, config)
        assert torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0), config.label
    assert _ran(static) == ran
    clock = PhaseClock(static.runner.device)
    static.prefill(layout, BlendConfig(mode="reuse"), observers=(clock,))
    assert _ran(static) == ran  # timed: the loop, whose phases the clock sees
    assert clock.seconds.get("project", 0) > 0
    held = static.prefill(layout, BlendConfig(mode="reuse"))
    assert _ran(static) == ran + 1
    beside = static.prefill(layout, BlendConfig(mode="reuse"))  # a buffer beside the pooled one
    assert _ran(static) == ran + 1  # a graph is bound to the pooled buffer's memory
    assert torch.allclose(beside.logits, held.logits, atol=1e-5, rtol=0)


def test_dynamic_rope_runs_the_layer_loop(engine_for):
    engine = engine_for("llama", compute=STATIC, rope={"rope_type": "dynamic", "factor": 2.0})
    assert engine.runner.static_passes is None


def test_shapes_and_buffers_kept_are_bounded(engine_for):
    engine = engine_for("llama", compute=STATIC)
    passes: StaticPasses = engine.runner.static_passes
    for k in range(1, len(PASSAGES) + 1):  # prompts of other lengths: other row buckets
        layout = engine.build_prompt(PREFIX, PASSAGES[:k], SUFFIX)
        engine.prefill(layout, BlendConfig(mode="reuse"))
    assert 1 <= passes.shapes <= StaticPasses.KEPT_BUFFERS * StaticPasses.KEPT_SHAPES
    engine.runner.release_buffers()
    assert passes.shapes == 0


def test_bad_compute_settings_are_refused():
    with pytest.raises(ValueError, match="passes must be one of"):
        ComputeConfig(passes="fast")


@pytest.mark.parametrize("config", [BlendConfig(mode="reuse"), BlendConfig(ratio=0.3)],
                         ids=["reuse", "blend"])
def test_a_bridge_after_cached_rows_writes_no_padding_into_the_chunks_after_it(chat_engine,
                                                                              config):
    """A request that starts from the prefix cache computes the rest of the piece its blocks
    stop in (the bridge), a pass whose prompt ends before the cached chunks after it, which
    the layer feed may have placed already: its padding goes to the request KV's last row,
    never into them."""
    from blendrag.engine.caches.context import NO_CONTEXT
    from blendrag.engine.caches.prefix_cache import PrefixCache

    def engine(compute):
        e = chat_engine(context=NO_CONTEXT, compute=compute)
        e.prefix_cache = PrefixCache(64 << 20, lambda: e.cache.identity.fingerprint,
                                     block_tokens=4)
        return e

    static, loop = engine(STATIC), engine(LOOP)
    a = static.build_prompt(PREFIX, PASSAGES[:3], SUFFIX)
    b = static.build_prompt(PREFIX, [PASSAGES[0], PASSAGES[2], PASSAGES[1]],
                            "\nQuestion: where?\nAnswer:")
    for e in (static, loop):
        e.prefill(a, BlendConfig(mode="full"))  # exact rows: the prefix, the passages
    ran = _ran(static)
    got, want = static.prefill(b, config), loop.prefill(b, config)
    assert got.stats.compute.bridged_tokens > 0  # a bridge ran, then the chunks' rows
    assert _ran(static) == ran + 2 + bool(got.stats.compute.preview_tokens)
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=0)
    n = b.num_tokens
    assert torch.allclose(got.fused.k[:, :, :n], want.fused.k[:, :, :n], atol=1e-5, rtol=0)


def test_a_capture_out_of_memory_is_tried_again_later_and_later(engine_for):
    """A shape whose capture runs out of device memory runs eagerly (exact) and is tried again
    after 2, then 4, then 8 more passes of it (each try runs the pass three times), never given
    up for good as a capture error of another kind is. (Captures are CUDA's; the bookkeeping is
    the pass's own, checked here.)"""
    engine = engine_for("llama", compute=STATIC)
    passes = engine.runner.static_passes
    fused = engine.runner.buffer(200)
    st = passes._state(fused, 16, 192, False)

    def out_of_memory(_):
        raise torch.OutOfMemoryError("no room for the graph's pool")

    passes._capture = out_of_memory  # type: ignore[method-assign]
    waits = []
    for seen in (2, 4, 8):
        st.seen = seen
        hidden = passes._replay(st)  # the pass run eagerly, as the layer loop would
        assert hidden.shape == (engine.model.config.hidden_size,) and torch.isfinite(hidden).all()
        waits.append(st.retry_at - seen)
        assert not passes.failed and st.graph is None
    assert waits == [2, 4, 8]
    def not_capturable(_):
        raise RuntimeError("a kernel that cannot be captured")

    passes._capture = not_capturable  # type: ignore[method-assign]
    passes._replay(st)
    assert passes.failed  # any other error: the layer loop from then on
