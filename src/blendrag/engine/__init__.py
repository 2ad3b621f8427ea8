"""The engine: prefill modes, blend, decoding. ``BlendEngine`` (``engine.py``) is its face."""

from blendrag.engine.compute.runner import ComputeConfig
from blendrag.engine.engine import BlendEngine
from blendrag.engine.request.generation import GenerationResult, GenerationStream
from blendrag.engine.request.prefill import Prefill
from blendrag.engine.request.stats import RequestStats

__all__ = ["BlendEngine", "ComputeConfig", "Prefill", "GenerationResult", "GenerationStream",
           "RequestStats"]
