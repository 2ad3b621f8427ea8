"""Bad input raises a ValueError that names the problem."""

from __future__ import annotations

import pytest

from blendrag import BlendConfig, CacheBlendOptions, GenerationConfig, PromptLayout
from blendrag.config import PreviewOptions, RandomOptions
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_ratio_outside_unit_interval(ratio):
    with pytest.raises(ValueError, match="ratio must be in"):
        BlendConfig(ratio=ratio)


def _cacheblend(ratio: float = 0.2, **options) -> BlendConfig:
    return BlendConfig(selector="cacheblend", ratio=ratio, options=CacheBlendOptions(**options))


@pytest.mark.parametrize("make, message", [
    (lambda: BlendConfig(mode="fast"), "mode must be one of"),
    (lambda: BlendConfig(selector="magic"), "selector must be one of"),
    (lambda: _cacheblend(check_layers=()), "check_layers"),
    (lambda: _cacheblend(check_layers=(2, 1)), "strictly increasing"),
    (lambda: _cacheblend(0.1, check_layers=(1, 2), ratio_schedule=(0.1, 0.2)), "non-increasing"),
    (lambda: _cacheblend(0.1, check_layers=(1, 2), ratio_schedule=(0.3, 0.2)), "end at ratio"),
    (lambda: _cacheblend(deviation="l1"), "deviation must be"),
    (lambda: BlendConfig(selector="epic", options=CacheBlendOptions()), "takes EpicOptions"),
    (lambda: BlendConfig(ratio="automatic"), "ratio must be"),
    (lambda: BlendConfig(ratio="auto>=x"), "ratio must be"),
    (lambda: _cacheblend(check_layers=(1.7,)), "check_layers must be layer indices"),
    (lambda: _cacheblend(check_layers=(True,)), "check_layers must be layer indices"),
    (lambda: _cacheblend(0.5, ratio_schedule=("0.5",)), "ratio_schedule must be numbers"),
    (lambda: BlendConfig(options=PreviewOptions(attention_floor=float("inf"))),
     "attention_floor must be a finite number"),
    (lambda: BlendConfig(options=PreviewOptions(span=2.0)), "span must be an integer"),
    (lambda: BlendConfig(selector="random", options=RandomOptions(seed="a")),
     "seed must be an integer"),
])
def test_bad_blend_config(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("kw, message", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("inf")}, r"temperature must be a number in \[0, 100\]"),
    ({"temperature": 1e30}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"stop": ("",)}, "stop must be non-empty strings"),
    ({"stop": (5,)}, "stop must be non-empty strings"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
    ({"top_k": 2.5}, "top_k must be an integer"),
    ({"top_k": float("nan")}, "top_k must be an integer"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_p": "0.5"}, "top_p"),
    ({"seed": "x"}, "seed must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"eos_token_ids": (2.5,)}, "eos_token_ids must be token ids"),
    ({"eos_token_ids": (-1,)}, "eos_token_ids must be token ids"),
    ({"stream_holdback": "no"}, "stream_holdback must be a bool"),
])
def test_bad_generation_config(kw, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**kw)


def test_plausible_generation_settings_are_taken_as_meant():
    assert GenerationConfig(stop=None).stop == () and GenerationConfig(stop="x").stop == ("x",)
    assert GenerationConfig(eos_token_ids=2).eos_token_ids == (2,)
    assert GenerationConfig(eos_token_ids=[2, 3]).eos_token_ids == (2, 3)


def test_a_bad_request_leaves_the_engine_serving_the_next(engine_for):
    """A float answer length once reached the pooled buffer's bookkeeping and failed every
    request after it; an id outside the vocabulary or a negative extra capacity failed deep in
    the model (on CUDA a device assert, fatal to the process). Each is refused up front."""
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
        engine.generate(layout, BlendConfig(mode="full"), GenerationConfig(max_new_tokens=2.5))
    with pytest.raises(ValueError, match="extra_capacity must be an integer >= 0"):
        engine.prefill(layout, BlendConfig(mode="full"), extra_capacity=-3)
    vocab = engine.vocab_size
    outside = PromptLayout(layout.prefix_ids, layout.chunk_ids, (*layout.suffix_ids, vocab))
    for mode in ("full", "blend"):
        with pytest.raises(ValueError, match=f"token id {vocab} is outside the model's "
                                             f"vocabulary of {vocab} ids"):
            engine.prefill(outside, BlendConfig(mode=mode))
    with pytest.raises(ValueError, match="token ids must be integers >= 0"):
        PromptLayout((1,), ((2, -5),), (7,))
    with pytest.raises(ValueError, match="token ids must be integers >= 0"):
        PromptLayout((1,), ((2, True),), (7,))
    engine.generate(layout, BlendConfig(mode="full"), GenerationConfig(max_new_tokens=2))


def test_an_answer_may_fill_the_context_to_its_last_position(engine_for):
    """n new tokens add n - 1 rows (the last is never fed back): a prompt one short of the
    context still gets two tokens, as HF's generate gives them."""
    engine = engine_for("llama")
    limit = engine.runner.max_positions
    layout = PromptLayout((1,), (tuple(5 + i % 200 for i in range(limit - 3)),), (7,))
    assert layout.num_tokens == limit - 1
    got = engine.generate(layout, BlendConfig(mode="full"),
                          GenerationConfig(max_new_tokens=2, eos_token_ids=()))
    assert len(got.token_ids) == 2
    with pytest.raises(ValueError, match="new tokens exceeds"):
        engine.generate(layout, BlendConfig(mode="full"), GenerationConfig(max_new_tokens=3))


def test_prompt_longer_than_context(engine_for):
    engine = engine_for("llama")
    long_chunk = tuple(range(5, 300)) * 4  # 1180 tokens > 1024 positions
    layout = PromptLayout((1,), (long_chunk,), (7, 8))
    with pytest.raises(ValueError, match="exceeds the model's context of 1024"):
        engine.prefill(layout, BlendConfig(mode="full"))
    ok = PromptLayout((1,), (long_chunk[:1000],), (7, 8))
    with pytest.raises(ValueError, match="new tokens exceeds"):
        engine.generate(ok, BlendConfig(mode="full"), GenerationConfig(max_new_tokens=100))


def test_check_layer_beyond_model(engine_for):
    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with pytest.raises(ValueError, match="exceed the model's 3 layers"):
        engine.prefill(layout, BlendConfig(selector="cacheblend",
                                               options=CacheBlendOptions(check_layers=(1, 5))))
    with pytest.raises(ValueError, match="cacheblend check layers must be >= 1"):
        engine.prefill(layout, BlendConfig(selector="cacheblend",
                                               options=CacheBlendOptions(check_layers=(0,))))


def test_unsupported_architecture_lists_supported():
    from transformers import GPT2Config, GPT2LMHeadModel

    from blendrag.model.adapters import adapter_for

    with pytest.raises(ValueError, match="supports Gemma2ForCausalLM, Gemma3ForCausalLM, "
                                         "LlamaForCausalLM, MistralForCausalLM, "
                                         "Olmo2ForCausalLM, Phi3ForCausalLM, "
                                         "Qwen2ForCausalLM, Qwen3ForCausalLM"):
        adapter_for(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)))


def test_bad_dtype(model_dir):
    from blendrag import BlendEngine

    with pytest.raises(ValueError, match="dtype must be one of"):
        BlendEngine.from_pretrained(model_dir("llama"), dtype="int8")
