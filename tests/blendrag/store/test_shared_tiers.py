"""The shared tiers a deployment puts behind several processes - a Redis Cluster and an S3 object
store - against real servers on loopback (a three-node cluster, Ceph RGW): the same storage
guarantees as the other tiers. A damaged object or layer is a miss and never wrong rows; only
this store's names are counted and cleared; a server that goes away benches the tier."""

from __future__ import annotations

import time
import uuid

import pytest
import torch

from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.layered import LayerReadError
from helpers.kvgen import make_kv, same_bits
from helpers.servers import redis_cluster_or_skip

KINDS = ["redis_cluster", "s3"]


class Shared:
    """One shared tier under a fresh prefix, with raw access to the stored bytes."""

    def __init__(self, kind: str, request) -> None:
        self.kind, self.prefix = kind, f"t{uuid.uuid4().hex[:8]}"
        if kind == "redis_cluster":
            self.server = request.getfixturevalue("redis_cluster")
            from redis.cluster import RedisCluster

            self.raw = RedisCluster.from_url(self.server.url)
        else:
            self.server = request.getfixturevalue("s3")
            self.raw = self.server.client()

    def config(self, **kw) -> StoreConfig:
        kw = {"ram_bytes": 0, "disk_dir": None, "kv_format": "model", **kw}
        if self.kind == "redis_cluster":
            return StoreConfig(redis_url=self.server.url, redis_prefix=self.prefix + ":", **kw)
        return StoreConfig(s3_url=f"s3://{self.server.bucket}/{self.prefix}",
                           s3_endpoint_url=self.server.endpoint, **kw)

    def name(self, key: str) -> str:
        return f"{self.prefix}:{key}" if self.kind == "redis_cluster" else f"{self.prefix}/{key}"

    def get(self, key: str) -> bytes:
        if self.kind == "redis_cluster":
            return self.raw.get(self.name(key))
        return self.raw.get_object(Bucket=self.server.bucket, Key=self.name(key))["Body"].read()

    def set(self, key: str, data: bytes, *, name: str | None = None) -> None:
        name = name or self.name(key)
        if self.kind == "redis_cluster":
            self.raw.set(name, data)
        else:
            self.raw.put_object(Bucket=self.server.bucket, Key=name, Body=data)

    def exists(self, key: str) -> bool:
        if self.kind == "redis_cluster":
            return bool(self.raw.exists(self.name(key)))
        listed = self.raw.list_objects_v2(Bucket=self.server.bucket, Prefix=self.name(key))
        return listed.get("KeyCount", 0) > 0


@pytest.fixture(params=KINDS)
def shared(request) -> Shared:
    return Shared(request.param, request)


def _read_layers(store: TieredKVStore, key: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    entry = store.open_layers(key)
    assert entry is not None
    try:
        return [entry.layer(i) for i in range(entry.num_layers)]
    finally:
        entry.close()


def test_entries_round_trip_whole_and_layer_by_layer(shared):
    kvs = {f"k{i}": make_kv(i, layers=3, tokens=40) for i in range(12)}
    with TieredKVStore(shared.config()) as store:
        for key, kv in kvs.items():
            store.put(key, kv)
        with TieredKVStore(shared.config()) as other:  # another process sees the same
            for key, kv in kvs.items():
                assert same_bits(other.get(key), kv)
                layers = _read_layers(other, key)
                assert all(torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])
                           for i, (k, v) in enumerate(layers))
            assert other.stats().tier(shared.kind.split("_")[0]).hits == 24
    if shared.kind == "redis_cluster":  # the keys really are spread over the nodes
        import redis

        per_node = [redis.Redis.from_url(u).dbsize() for u in shared.server.node_urls()]
        assert sum(n > 0 for n in per_node) >= 2


def test_a_damaged_object_is_a_miss_and_is_deleted(shared):
    with TieredKVStore(shared.config()) as store:
        kv = make_kv(7, layers=3, tokens=40)
        store.put("k", kv)
        data = bytearray(shared.get("k"))
        data[-5] ^= 0xFF  # inside the last tensor's bytes
        shared.set("k", bytes(data))
        assert store.get("k") is None
        assert not shared.exists("k")  # a fresh read failed too: the entry was deleted
        store.put("k", kv)
        shared.set("k", bytes(data))
        with pytest.raises(LayerReadError):  # layer-wise: the damaged layer fails, never rows
            _read_layers(store, "k")
        store.put("t", kv)
        whole = shared.get("t")
        shared.set("t", whole[: len(whole) // 2])  # truncated
        assert store.get("t") is None
        assert store.stats().tier(shared.kind.split("_")[0]).corrupt >= 2


def test_count_and_clear_touch_only_this_prefix(shared):
    other = Shared(shared.kind, _Request(shared))
    with TieredKVStore(shared.config()) as mine, TieredKVStore(other.config()) as theirs:
        for i in range(5):
            mine.put(f"k{i}", make_kv(i))
        theirs.put("k0", make_kv(0))
        nested = f"{shared.prefix}/x/k9" if shared.kind == "s3" else f"{shared.prefix}:x:k9"
        shared.set("", b"not ours", name=nested)
        tier = mine.tiers[0].tier  # the store's one tier
        assert tier.count_entries() == 5
        mine.clear()
        assert tier.count_entries() == 0 and not mine.contains("k1")
        assert same_bits(theirs.get("k0"), make_kv(0))
        assert shared.exists("x") or shared.kind == "redis_cluster"
        if shared.kind == "redis_cluster":
            assert shared.raw.get(nested) == b"not ours"


class _Request:
    """Just enough of pytest's request for a second ``Shared`` on the same server."""

    def __init__(self, shared: Shared) -> None:
        self._server = shared.server

    def getfixturevalue(self, name: str):
        return self._server


def test_a_server_that_goes_away_benches_the_tier_and_loses_nothing(request, tmp_path):
    """The server stops between requests: reads are misses (no exception), the tier is benched
    at once (one timeout, not one per key), the disk keeps serving, and once the server is back
    its entries are read again."""
    for kind in KINDS:
        if kind == "redis_cluster":
            shared = Shared(kind, request)
            shared.server = own = redis_cluster_or_skip()  # stopped for good below
        else:
            shared = Shared(kind, request)
        config = shared.config(disk_dir=tmp_path / kind, retry_after_s=1.0, redis_timeout_s=1.0,
                               s3_timeout_s=1.0)
        with TieredKVStore(config) as store:
            store.put("k", make_kv(1))
            store.put("only-remote", make_kv(2), ram=False)
            remote = shared.kind.split("_")[0]
            if kind == "s3":
                shared.server.stop_gateway()
            else:
                own.stop()
            try:
                assert same_bits(store.get("k"), make_kv(1))  # from disk
                store.tiers[0].tier.delete("only-remote")  # on disk only; remote is down
                assert store.get("only-remote") is None
                assert not store.stats().tier(remote).available
                assert store.problems()
            finally:
                if kind == "s3":
                    shared.server.start_gateway()
            if kind == "s3":  # back (and its bench of 1 s over): the entry it holds is read again
                time.sleep(1.0)
                assert same_bits(store.get("only-remote"), make_kv(2))


def test_a_cluster_url_naming_a_database_is_refused(redis_cluster):
    with pytest.raises(ValueError, match="Redis Cluster node, which has only database 0"):
        TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=None, redis_url=redis_cluster.url + "/1"))


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/", "http://x/y", "s3:///prefix"])
def test_an_s3_url_without_bucket_and_prefix_is_refused(url):
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        StoreConfig(s3_url=url)
