"""The engine: prefill modes, blend, decoding. ``BlendEngine`` (``engine.py``) is its face."""

from blendrag.engine.engine import BlendEngine
from blendrag.engine.generation import GenerationResult, GenerationStream
from blendrag.engine.request import Prefill
from blendrag.engine.stats import RequestStats

__all__ = ["BlendEngine", "Prefill", "GenerationResult", "GenerationStream", "RequestStats"]
