"""One small adapter per model family: the only architecture-specific code in blendrag.

``adapter_for(model)`` picks the adapter of the model's class; a class not listed in
``ADAPTERS`` is refused with the list of supported ones.
"""

from __future__ import annotations

from blendrag.model.adapters.base import HFModule, LlamaAdapter, Rotary
from blendrag.model.adapters.llama_like import MistralAdapter, Qwen2Adapter, Qwen3Adapter

__all__ = ["ADAPTERS", "HFModule", "LlamaAdapter", "MistralAdapter", "Qwen2Adapter",
           "Qwen3Adapter", "Rotary", "adapter_for"]

ADAPTERS: dict[str, type[LlamaAdapter]] = {
    "LlamaForCausalLM": LlamaAdapter,
    "MistralForCausalLM": MistralAdapter,
    "Qwen2ForCausalLM": Qwen2Adapter,
    "Qwen3ForCausalLM": Qwen3Adapter,
}


def adapter_for(model: HFModule) -> LlamaAdapter:
    """The adapter of ``model``'s family; ValueError listing the supported ones otherwise, or
    naming the feature of a supported family that blendrag cannot run exactly."""
    name = type(model).__name__
    if name not in ADAPTERS:
        raise ValueError(
            f"unsupported architecture {name!r}; blendrag supports {', '.join(sorted(ADAPTERS))}"
        )
    return ADAPTERS[name](model)
