"""Decoding: greedy equals HF generate; sampling, stop strings, EOS, streaming, stats."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, ComputeConfig, GenerationConfig
from blendrag.engine.compute.decode import StaticDecoder
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FULL = BlendConfig(mode="full")
# eager decoding, and the fixed-shape step a CUDA graph replays on a GPU (run eagerly here)
DECODES = {"eager": ComputeConfig(decode="eager"), "graph": ComputeConfig(decode="graph")}


@pytest.mark.parametrize("decode", list(DECODES))
def test_greedy_after_full_equals_hf_generate(engine_for, decode):
    engine = engine_for("llama", compute=DECODES[decode])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    # never stop early: compare 24 tokens
    gen = GenerationConfig(max_new_tokens=24, eos_token_ids=())
    ours = engine.generate(layout, FULL, gen)
    with torch.no_grad():
        ref = engine.model.generate(torch.tensor([layout.ids]), max_new_tokens=24, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
    assert ours.token_ids == ref[0, layout.num_tokens:].tolist()
    assert ours.finish_reason == "length" and ours.stats.decode.new_tokens == 24


@pytest.mark.parametrize("decode", list(DECODES))
def test_greedy_with_sliding_window_and_qk_norm_equals_hf_generate(engine_for, decode):
    compute = DECODES[decode]
    for engine in (engine_for("mistral", sliding_window=24, compute=compute),
                   engine_for("qwen3", compute=compute)):
        layout = engine.build_prompt(PREFIX, PASSAGES[:2], SUFFIX)
        ours = engine.generate(layout, FULL, GenerationConfig(max_new_tokens=12, eos_token_ids=()))
        with torch.no_grad():
            ref = engine.model.generate(torch.tensor([layout.ids]), max_new_tokens=12,
                                        do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
        assert ours.token_ids == ref[0, layout.num_tokens:].tolist()


@pytest.mark.parametrize("decode", list(DECODES))
def test_decoding_takes_attention_output_in_any_memory_order(engine_for, decode, monkeypatch):
    """CUDA's flash kernel returns SDPA's [B, H, L, D] output over [B, L, H, D] memory: the
    decoding step must reshape, not view (found on an H200; reproduced here on the CPU)."""
    engine = engine_for("llama", compute=DECODES[decode])
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    gen = GenerationConfig(max_new_tokens=8, eos_token_ids=())
    want = engine.generate(layout, FULL, gen).token_ids
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def flash_layout(*args, **kwargs):  # same values, the flash kernel's strides
        return sdpa(*args, **kwargs).transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", flash_layout)
    assert engine.generate(layout, FULL, gen).token_ids == want


def test_stream_yields_the_text_of_generate(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for cfg in (FULL, BlendConfig(ratio=0.2)):
        gen = GenerationConfig(max_new_tokens=20, eos_token_ids=())
        stream = engine.stream(layout, cfg, gen)
        deltas = list(stream)
        assert "".join(deltas) == engine.generate(layout, cfg, gen).text == stream.result.text
        assert len(deltas) > 1


def test_sampling_is_seeded_and_respects_top_k(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    gen = GenerationConfig(max_new_tokens=16, temperature=1.5, top_p=0.9, seed=7, eos_token_ids=())
    a = engine.generate(layout, FULL, gen).token_ids
    b = engine.generate(layout, FULL, gen).token_ids
    c = engine.generate(layout, FULL,
                        GenerationConfig(max_new_tokens=16, temperature=1.5, top_p=0.9, seed=8,
                                                       eos_token_ids=())).token_ids
    assert a == b and a != c
    # top_k=1 sampling is greedy whatever the temperature
    greedy = engine.generate(layout, FULL,
                             GenerationConfig(max_new_tokens=8, eos_token_ids=())).token_ids
    k1 = engine.generate(layout, FULL,
                         GenerationConfig(max_new_tokens=8, temperature=2.0, top_k=1, seed=3,
                                                        eos_token_ids=())).token_ids
    assert k1 == greedy


def test_stop_string_truncates_and_is_never_streamed(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    text = engine.generate(layout, FULL, GenerationConfig(max_new_tokens=30, eos_token_ids=())).text
    stop = text[5:8]  # a string the model really produces
    gen = GenerationConfig(max_new_tokens=30, stop=(stop,), eos_token_ids=())
    res = engine.generate(layout, FULL, gen)
    assert res.finish_reason == "stop" and res.text == text[: text.find(stop)]
    streamed = "".join(engine.stream(layout, FULL, gen))
    assert streamed == res.text and stop not in streamed


def test_eos_ends_generation(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    ids = engine.generate(layout, FULL,
                          GenerationConfig(max_new_tokens=10, eos_token_ids=())).token_ids
    res = engine.generate(layout, FULL,
                          GenerationConfig(max_new_tokens=10, eos_token_ids=(ids[3],)))
    assert res.finish_reason == "eos" and res.token_ids == ids[: ids.index(ids[3])]


def test_stats_report_reuse_and_recompute(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    res = engine.generate(layout, BlendConfig(selector="cacheblend", ratio=0.25),
                          GenerationConfig(max_new_tokens=6, eos_token_ids=()))
    s = res.stats
    layers = engine.adapter.num_layers
    assert s.prompt.chunks == 4 and s.cache.chunk_hits + s.cache.chunk_misses == 4
    assert s.cache.tokens_reused == len(layout.prefix_ids) + s.prompt.chunk_tokens
    expected = -(-s.prompt.chunk_tokens // 4)  # ceil(0.25 * chunk tokens)
    recomputed = s.compute.recomputed_chunk_tokens_per_layer
    assert recomputed == [s.prompt.chunk_tokens] + [expected] * (layers - 1)
    assert s.compute.computed_per_layer[-1] == expected + len(layout.suffix_ids)
    assert s.timing.ttft_s > 0 and s.decode.new_tokens == 6 and s.decode.decode_tokens_per_s > 0


def test_the_fixed_shape_step_equals_eager_decoding_and_reuses_its_buffer(engine_for):
    """Step by step, the logits of the fixed-shape step (over the whole buffer, masked) equal
    the eager step's; a later request in the same pooled buffer reuses the step (on a GPU: its
    captured graph) and still decodes from its own rows."""
    eager = engine_for("llama", compute=DECODES["eager"])
    static = engine_for("llama", compute=DECODES["graph"])
    assert isinstance(static.runner.static_decoder, StaticDecoder)
    assert eager.runner.static_decoder is None
    for passages in (PASSAGES, PASSAGES[:2]):
        layout = eager.build_prompt(PREFIX, passages, SUFFIX)
        a = eager.prefill(layout, FULL, extra_capacity=8)
        b = static.prefill(layout, FULL, extra_capacity=8)
        token = int(a.logits.argmax())
        for _ in range(8):
            la, lb = eager.runner.decode(token, a.fused), static.runner.decode(token, b.fused)
            assert (la - lb).abs().max() < 1e-5
            token = int(la.argmax())
        del a, b
    assert static.runner.static_decoder.buffers == 1


def test_the_fixed_shape_step_does_not_keep_a_requests_buffer(engine_for):
    """A request that decodes in a buffer of its own (the pooled one lent to another) frees it
    when it is dropped: the step made over it keeps its tables, not the request's rows."""
    import gc
    import weakref

    static = engine_for("llama", compute=DECODES["graph"])
    layout = static.build_prompt(PREFIX, PASSAGES, SUFFIX)
    held = static.prefill(layout, FULL, extra_capacity=8)  # holds the pooled buffer
    own = static.prefill(layout, FULL, extra_capacity=8)
    assert own.fused.base[0].data_ptr() != held.fused.base[0].data_ptr()
    token = int(own.logits.argmax())
    for _ in range(3):
        token = int(static.runner.decode(token, own.fused).argmax())
    gone = weakref.ref(own.fused.base[0])
    del own
    gc.collect()
    assert gone() is None and static.runner.static_decoder.buffers == 1
    del held
