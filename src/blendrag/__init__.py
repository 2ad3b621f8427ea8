"""blendrag: RAG prefill from cached chunk KVs with selective recompute (CacheBlend).

The public names below are imported on first use: ``import blendrag`` (and so every
``blendrag --help``) must not pay for torch and transformers (several seconds) before they are
needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from blendrag.config import (
        Ape,
        BlendConfig,
        CacheBlendOptions,
        EpicOptions,
        GenerationConfig,
        PreviewOptions,
        ProfileOptions,
        QueryOptions,
        RandomOptions,
    )
    from blendrag.engine import (
        BlendEngine,
        ComputeConfig,
        GenerationResult,
        Prefill,
        RequestStats,
    )
    from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
    from blendrag.engine.request.warmup import WarmupConfig
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.kv.chunk_kv import ChunkKV
    from blendrag.prompt import PromptBuilder, PromptLayout
    from blendrag.spec import EngineSpec
    from blendrag.store.protocol import KVStore
    from blendrag.store.ram import MemoryKVStore

_EXPORTS = {
    "Ape": "blendrag.config", "BlendConfig": "blendrag.config",
    "GenerationConfig": "blendrag.config",
    "CacheBlendOptions": "blendrag.config", "EpicOptions": "blendrag.config",
    "PreviewOptions": "blendrag.config", "ProfileOptions": "blendrag.config",
    "QueryOptions": "blendrag.config", "RandomOptions": "blendrag.config",
    "BlendEngine": "blendrag.engine", "ComputeConfig": "blendrag.engine",
    "GenerationResult": "blendrag.engine",
    "Prefill": "blendrag.engine", "RequestStats": "blendrag.engine",
    "NO_CONTEXT": "blendrag.engine.caches.context",
    "ChunkContext": "blendrag.engine.caches.context",
    "LoadingConfig": "blendrag.engine.selection.controller",
    "WarmupConfig": "blendrag.engine.request.warmup",
    "ChunkKV": "blendrag.kv.chunk_kv",
    "PromptBuilder": "blendrag.prompt", "PromptLayout": "blendrag.prompt",
    "EngineSpec": "blendrag.spec",
    "KVStore": "blendrag.store.protocol", "MemoryKVStore": "blendrag.store.ram",
}

__all__ = [
    "NO_CONTEXT", "Ape", "BlendConfig", "BlendEngine", "CacheBlendOptions", "ChunkContext",
    "ChunkKV", "ComputeConfig", "EngineSpec",
    "EpicOptions", "GenerationConfig", "GenerationResult", "KVStore", "LoadingConfig",
    "MemoryKVStore", "Prefill", "PreviewOptions", "ProfileOptions", "PromptBuilder",
    "PromptLayout", "QueryOptions", "RandomOptions", "RequestStats", "WarmupConfig",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blendrag' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
