"""Persistent chunk-KV store: RAM LRU → disk (diskcache) → Redis, safetensors entries.

See docs/store.md. The engine uses ``TieredKVStore`` through the ``KVStore`` protocol
(``get``/``put``/``contains``); everything else here is for tools and precompute jobs.
"""

from blendrag.store.codec import EntryError, EntryReader, decode, encode, open_entry
from blendrag.store.config import DEFAULT_DISK_DIR, StoreConfig
from blendrag.store.disk import DiskTier
from blendrag.store.redis_tier import RedisTier
from blendrag.store.stats import StoreStats, TierStats, TierUsage
from blendrag.store.tiered import TieredKVStore

__all__ = [
    "DEFAULT_DISK_DIR",
    "DiskTier",
    "EntryError",
    "EntryReader",
    "RedisTier",
    "StoreConfig",
    "StoreStats",
    "TierStats",
    "TierUsage",
    "TieredKVStore",
    "decode",
    "encode",
    "open_entry",
]
