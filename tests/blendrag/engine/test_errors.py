"""Bad input raises a ValueError that names the problem."""

from __future__ import annotations

import pytest

from blendrag import BlendConfig, CacheBlendOptions, GenerationConfig, PromptLayout
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
    ({"stop": ("",)}, "stop strings"),
])
def test_bad_generation_config(kw, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**kw)


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
