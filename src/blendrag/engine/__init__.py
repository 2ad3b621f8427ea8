"""The engine: prefill modes, blend, decoding. ``BlendEngine`` (``engine.py``) is its face."""

from blendrag.engine.engine import BlendEngine
from blendrag.engine.generation import GenerationResult, GenerationStream
from blendrag.engine.request import Prefill
from blendrag.engine.runner import ComputeConfig
from blendrag.engine.stats import RequestStats

__all__ = ["BlendEngine", "ComputeConfig", "Prefill", "GenerationResult", "GenerationStream",
           "RequestStats"]
