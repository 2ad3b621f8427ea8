"""One small adapter per model family: the only architecture-specific code in blendrag.

``adapter_for(model)`` picks the adapter of the model's class; a class not listed in
``ADAPTERS`` is refused with the list of supported ones. How to add a family, and the tests
that show it right: docs/architecture.md, "Adding a model family".
"""

from __future__ import annotations

from blendrag.model.adapters.base import HFModule, LlamaAdapter, Rotary
from blendrag.model.adapters.gemma import Gemma2Adapter, Gemma3Adapter
from blendrag.model.adapters.llama_like import MistralAdapter, Qwen2Adapter, Qwen3Adapter
from blendrag.model.adapters.olmo2 import Olmo2Adapter
from blendrag.model.adapters.phi3 import Phi3Adapter

__all__ = ["ADAPTERS", "Gemma2Adapter", "Gemma3Adapter", "HFModule", "LlamaAdapter",
           "MistralAdapter", "Olmo2Adapter", "Phi3Adapter", "Qwen2Adapter", "Qwen3Adapter",
           "Rotary", "adapter_for"]

ADAPTERS: dict[str, type[LlamaAdapter]] = {
    "LlamaForCausalLM": LlamaAdapter,
    "MistralForCausalLM": MistralAdapter,
    "Qwen2ForCausalLM": Qwen2Adapter,
    "Qwen3ForCausalLM": Qwen3Adapter,
    "Gemma2ForCausalLM": Gemma2Adapter,
    "Gemma3ForCausalLM": Gemma3Adapter,
    "Phi3ForCausalLM": Phi3Adapter,
    "Olmo2ForCausalLM": Olmo2Adapter,
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
