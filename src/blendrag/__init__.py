"""blendrag: RAG prefill from cached chunk KVs with selective recompute (CacheBlend)."""

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationResult, Prefill, RequestStats
from blendrag.engine.context import NO_CONTEXT, ChunkContext
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.prompt import PromptBuilder, PromptLayout
from blendrag.store.protocol import KVStore
from blendrag.store.ram import MemoryKVStore

__all__ = [
    "BlendConfig", "BlendEngine", "ChunkContext", "ChunkKV", "GenerationConfig", "GenerationResult",
    "KVStore", "MemoryKVStore", "NO_CONTEXT", "Prefill", "PromptBuilder", "PromptLayout",
    "RequestStats",
]
__version__ = "0.1.0"
