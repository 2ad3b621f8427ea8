"""The chunk-KV store: the ``KVStore`` protocol with typed stats, RAM, disk and Redis tiers, the
tiered store over them, and the entries' byte format.

See docs/store.md. The engine uses a store through ``KVStore`` (``protocol.py``): by default
``MemoryKVStore`` (``ram.py``); ``TieredKVStore`` (``tiered.py``) adds persistence. Names are
imported on first use, so ``import blendrag`` does not load the disk and Redis clients.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KVStore": "protocol", "StoreStats": "protocol",
    "TierStats": "protocol",
    "TierUsage": "protocol",
    "ByteTier": "tier", "Tier": "tier",
    "MemoryKVStore": "ram", "RamTier": "ram", "held_bytes": "ram",
    "DiskTier": "disk",
    "RedisTier": "redis_tier",
    "TieredKVStore": "tiered",
    "Entry": "codec", "EntryError": "errors", "EntryReader": "entry_reader", "decode": "codec",
    "encode": "codec",
    "open_entry": "codec",
    "DEFAULT_DISK_DIR": "config", "StoreConfig": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blendrag.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"blendrag.store.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return __all__
