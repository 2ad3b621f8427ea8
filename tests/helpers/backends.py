"""One tier kind alone in a store - RAM, disk, a Redis server, a Redis Cluster, S3 - under a fresh
prefix, with raw access to what the tier stores (its names, and a byte tier's bytes), for tests
that check what lands in each tier, on the real servers the suite starts."""

from __future__ import annotations

import uuid
from pathlib import Path

from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.tier import ByteTier

KINDS = ["ram", "disk", "redis", "redis_cluster", "s3"]
BYTE_KINDS = KINDS[1:]


class Backend:
    """``kind``'s tier alone, under a prefix of its own; ``request``: the test's (servers)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        self.kind, self.tmp_path = kind, tmp_path
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.server = None
        if kind in ("redis", "redis_cluster"):
            self.server = request.getfixturevalue(
                "redis_server" if kind == "redis" else "redis_cluster")
        elif kind == "s3":
            self.server = request.getfixturevalue("s3")

    def config(self, **kw) -> StoreConfig:
        """A ``StoreConfig`` of this tier alone (with the RAM tier too when ``ram_bytes``)."""
        kw = {"ram_bytes": 0, "disk_dir": None, "kv_format": "model", **kw}
        if self.kind == "ram":
            kw["ram_bytes"] = kw["ram_bytes"] or 1 << 20
        elif self.kind == "disk":
            kw["disk_dir"] = self.tmp_path / "kv"
        elif self.kind in ("redis", "redis_cluster"):
            kw.update(redis_url=self.server.url, redis_prefix=self.prefix + ":")
        else:
            kw.update(s3_url=f"s3://{self.server.bucket}/{self.prefix}",
                      s3_endpoint_url=self.server.endpoint)
        return StoreConfig(**kw)

    def store(self, **kw) -> TieredKVStore:
        return TieredKVStore(self.config(**kw))

    @staticmethod
    def tier(store: TieredKVStore) -> ByteTier:
        """The store's slowest tier (this backend's), as a byte tier: its ``fetch`` and ``put``
        read and write stored bytes as they are."""
        tier = store.tiers[-1].tier
        if not isinstance(tier, ByteTier):
            raise TypeError(f"{tier.label} stores no bytes")
        return tier

    def raw_names(self, store: TieredKVStore) -> list[str]:
        """Every name the tier holds, as the storage spells it (Redis keys, S3 object keys,
        disk and RAM keys), this prefix's only."""
        tier = store.tiers[-1].tier
        if self.kind == "ram":
            return list(tier.lru.keys())  # type: ignore[attr-defined]
        if self.kind == "disk":
            return list(tier.keys())  # type: ignore[attr-defined]
        if self.kind in ("redis", "redis_cluster"):
            import redis
            from redis.cluster import RedisCluster

            client = (RedisCluster.from_url(self.server.url) if self.kind == "redis_cluster"
                      else redis.Redis.from_url(self.server.url))
            try:
                return sorted(n.decode() for n in client.scan_iter(match=f"{self.prefix}:*"))
            finally:
                client.close()
        client = self.server.client()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.server.bucket, Prefix=f"{self.prefix}/")
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    @staticmethod
    def fetch(store: TieredKVStore, name: str) -> bytes | None:
        """The bytes stored under ``name`` (a stored name: ``store.stored_name(key)``)."""
        found = Backend.tier(store).fetch(name)
        if found is None or isinstance(found, bytes):
            return found
        with found:
            return found.read()

    @staticmethod
    def put(store: TieredKVStore, name: str, data: bytes) -> None:
        """Store ``data`` under ``name`` as it is: what anyone who can write the tier can do."""
        Backend.tier(store).put(name, data)
