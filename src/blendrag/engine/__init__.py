"""The engine: prefill modes, blend, decoding."""

from blendrag.engine.engine import BlendEngine, Prefill
from blendrag.engine.generation import GenerationResult, GenerationStream
from blendrag.engine.stats import RequestStats

__all__ = ["BlendEngine", "Prefill", "GenerationResult", "GenerationStream", "RequestStats"]
