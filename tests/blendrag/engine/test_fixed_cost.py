"""The fixed cost of a cached request: pooled request buffers, keys rotated in place,
one attention computation in the preview pass, the per-phase clock and the attention work
counted per layer. Each change must leave the logits as they were."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig
from blendrag.engine.compute.fused_kv import BufferPool
from blendrag.engine.compute.layer import attention_probs
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.compute.observers import PHASES, KeyAttention, PhaseClock, Trace
from blendrag.model.rope import RopeTable
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

CPU = torch.device("cpu")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's own rotation, the reference: x * cos + rotate_half(x) * sin."""
    from transformers.models.llama.modeling_llama import rotate_half

    return x * cos + rotate_half(x) * sin
MODES = [BlendConfig(mode="full"), BlendConfig(mode="prefix"), BlendConfig(mode="reuse"),
         BlendConfig(mode="blend", selector="preview", ratio=0.3),
         BlendConfig(mode="blend", selector="cacheblend", ratio=0.3),
         BlendConfig(mode="blend", selector="epic", ratio=0.3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_into_is_hf_rope_bit_for_bit(engine_for, dtype):
    rotary = engine_for("llama").adapter.rotary
    table = RopeTable(rotary, 40, dtype, CPU)
    x = torch.randn(40, 2, 16).to(dtype).transpose(0, 1)  # [heads, T, D], not contiguous
    out = torch.full((2, 50, 16), float("nan"), dtype=dtype)[:, 5:45]  # rows of a buffer
    table.rotate_into(out[:, :34], x[:, 3:37], slice(3, 37))
    assert out[:, 34:].isnan().all()  # nothing written outside the rows
    ref = apply_rope(x[:, 3:37], table.cos[3:37], table.sin[3:37])
    assert torch.equal(out[:, :34], ref)
    assert torch.equal(table.rotate(x, torch.arange(40)), apply_rope(x, table.cos, table.sin))


@pytest.mark.parametrize("family", ["llama", "olmo2", "phi3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotating_rows_in_place_is_rotate_into_bit_for_bit(engine_for, family, dtype):
    """The feed copies several segments' pre-RoPE keys side by side and rotates them where
    they lie: the same bits as rotating each into its rows (OLMo 2: cos/sin in float32; Phi-3
    here: partial rotary)."""
    kw = {"partial_rotary_factor": 0.75} if family == "phi3" else {}
    rotary = engine_for(family, **kw).adapter.rotary
    table = RopeTable(rotary, 60, dtype, CPU)
    x = torch.randn(2, 50, 16).to(dtype)  # [heads, T, D]
    ref = torch.empty_like(x)
    table.rotate_into(ref, x, slice(7, 57))
    rows = torch.full((2, 64, 16), float("nan"), dtype=dtype)
    rows[:, 7:57] = x
    table.at(slice(7, 57)).rotate_in_place(rows[:, 7:57])
    assert torch.equal(rows[:, 7:57].contiguous().view(torch.uint8), ref.view(torch.uint8))
    assert rows[:, :7].isnan().all() and rows[:, 57:].isnan().all()


def test_pool_lends_a_buffer_again_only_when_no_view_of_it_lives():
    pool = BufferPool()
    with torch.inference_mode():
        a = pool.take(2, 2, 10, 4, torch.float32, CPU)
        b = pool.take(2, 2, 10, 4, torch.float32, CPU)  # a is alive: a buffer of its own
        assert a.k.data_ptr() != b.k.data_ptr()
        base = a.k.data_ptr()
        del a
        c = pool.take(2, 2, 8, 4, torch.float32, CPU)  # smaller: views of the pooled one
        assert c.k.data_ptr() == base and c.capacity == 8
        kept = c.v[1]
        del c
        assert pool.take(2, 2, 8, 4, torch.float32, CPU).k.data_ptr() != base  # a view lives
        del kept
        assert pool.take(2, 2, 8, 4, torch.float32, CPU).k.data_ptr() == base
        # buffers hold whole key blocks of FlexAttention, at least two: 256 rows for 10
        whole = pool.take(2, 2, 256, 4, torch.float32, CPU)
        assert whole.k.data_ptr() == base and whole.base[0].shape[2] == 256
        del whole
        bigger = pool.take(2, 2, 300, 4, torch.float32, CPU)  # too small: replaced
        assert bigger.k.data_ptr() != base and bigger.capacity == 300
        assert bigger.base[0].shape[2] == 384
        assert pool.take(2, 2, 8, 4, torch.bfloat16, CPU).k.dtype == torch.bfloat16


def test_a_kept_prefill_keeps_its_rows_while_later_requests_run(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    first = engine.prefill(layout, BlendConfig(mode="reuse"))
    rows = first.fused.k[:, :, :layout.num_tokens].clone()
    other = engine.build_prompt(PREFIX, PASSAGES[::-1], "Another question?")
    for config in MODES:
        engine.prefill(other, config)
    assert torch.equal(first.fused.k[:, :, :layout.num_tokens], rows)


@pytest.mark.parametrize("config", MODES, ids=lambda c: c.label)
def test_pooled_buffers_change_no_logits(engine_for, config):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    other = engine.build_prompt(PREFIX, PASSAGES[:2], "Something else entirely?")
    first = engine.prefill(layout, config).logits
    engine.prefill(other, config)  # leaves its rows in the pooled buffer
    again = engine.prefill(layout, config).logits
    engine.release_buffers()
    fresh = engine.prefill(layout, config).logits
    assert torch.equal(first, again) and torch.equal(again, fresh)


def test_preview_attention_is_the_explicit_probabilities(engine_for):
    """One attention computation serves the layer's output and the selector's scores: the
    scores equal the probabilities computed apart from the loop, and the output equals the
    loop's ordinary attention (the reuse pass over the same rows)."""
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    runner = engine.runner
    n, lo, hi = layout.num_tokens, len(layout.prefix_ids), layout.suffix_start
    ids, suffix = torch.tensor(layout.ids), torch.arange(hi, n)
    rope = runner.rope(n)
    with engine.cache.rows_for(layout, BlendConfig(mode="reuse")) as rows:
        scored, attention, trace = runner.buffer(n), KeyAttention(lo, hi), Trace()
        out = runner.run(LoopPlan(ids, suffix, feed=runner.feed(rows.segments, scored, rope)),
                         scored, rope, (attention, trace))
        plain = runner.buffer(n)
        ref = runner.run(LoopPlan(ids, suffix, feed=runner.feed(rows.segments, plain, rope)),
                         plain, rope)
    assert torch.allclose(out.hidden, ref.hidden, atol=1e-5)
    for i, step in enumerate(trace.layers):
        probs = attention_probs(step["q"], scored.k[i, :, :n], step["pos"], engine.adapter.scaling)
        assert torch.allclose(attention.attention[i], probs[:, :, lo:hi].sum(dim=(0, 1)),
                              atol=1e-5)
    assert attention.attention.shape == (engine.adapter.num_layers, hi - lo)


@pytest.mark.parametrize("config", MODES, ids=lambda c: c.label)
def test_timed_prefill_charges_every_phase_and_changes_nothing(engine_for, config):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    plain = engine.prefill(layout, config)
    clock = PhaseClock(engine.device)
    timed = engine.prefill(layout, config, observers=[clock])
    assert torch.equal(plain.logits, timed.logits)
    phases = clock.seconds
    assert set(phases) <= set(PHASES)
    assert {"fetch", "setup", "project", "attention", "mlp", "logits"} <= set(phases)
    preview = config.selector == "preview" and config.mode == "blend"
    assert ("preview" in phases) == preview
    # the preview pass loads the cached rows for the blend pass (and is charged for it)
    assert ("load" in phases) == (config.mode != "full" and not preview)
    assert ("select" in phases) == (config.selector == "cacheblend" and config.mode == "blend")
    assert 0 < sum(phases.values()) <= timed.stats.timing.ttft_s


def test_attention_work_is_counted_per_layer(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    n, s, layers = layout.num_tokens, layout.suffix_start, engine.adapter.num_layers
    full = engine.prefill(layout, BlendConfig(mode="full")).stats
    assert full.compute.attended_keys_per_layer == [n * (n + 1) // 2] * layers
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).stats
    assert reuse.compute.attended_keys_per_layer == [sum(range(s + 1, n + 1))] * layers
    preview = engine.prefill(layout, BlendConfig(selector="preview", ratio=0.3)).stats
    assert preview.compute.preview_attended_keys == layers * sum(range(s + 1, n + 1))


def test_sliding_window_caps_the_keys_counted(engine_for):
    engine = engine_for("mistral", sliding_window=8)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    n = layout.num_tokens
    full = engine.prefill(layout, BlendConfig(mode="full")).stats
    assert full.compute.attended_keys_per_layer[0] == sum(min(p + 1, 8) for p in range(n))

