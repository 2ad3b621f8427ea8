"""Redis tier: entries shared by several processes or machines through one Redis server.

Each entry is one Redis string ``{namespace}:{key}`` holding the encoded bytes, where the
namespace is the prefix less its trailing colons (the default ``blendrag:kv:`` gives names
``blendrag:kv:<key>``). The colon is the delimiter and keys never contain one, so namespaces
are disjoint: ``app1`` owns ``app1:<key>`` and nothing of ``app10:…`` or ``app1:x:…``, and
``clear()`` and ``count_entries()`` touch exactly the names of their own. The tier does not
bound its own size: configure the server (``maxmemory`` with ``maxmemory-policy allkeys-lru``)
or give entries a TTL (``StoreConfig.redis_ttl_s``).

The URL may name any node of a Redis Cluster (or a Valkey cluster): the tier asks the server
on first use and, when it is a cluster node, talks to the whole cluster through redis-py's
``RedisCluster`` client, which routes each key's commands to the node holding its hash slot;
``clear()`` and ``count_entries()`` then scan every primary. A cluster has only database 0,
so a URL naming another one is refused.

A reply shorter than the value the server holds (``STRLEN``, asked in the same transaction) is
a ``ShortReply``: bytes lost on the way say nothing about the entry, so it is a storage failure
(a miss and a strike against the tier), never a reason to delete it. A connection that is
refused, cut or timed out benches the tier at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

from blendrag.store.auth import StoreKeys
from blendrag.store.health import transient_os_error
from blendrag.store.names import split
from blendrag.store.protocol import TierUsage
from blendrag.store.readers import RangeReader, scatter
from blendrag.store.tier import ByteTier

try:  # optional dependency: blendrag[redis]
    import redis
except ImportError:  # pragma: no cover - exercised only without the extra installed
    redis = None  # type: ignore[assignment]

_SCAN_BATCH = 500


class ShortReply(Exception):
    """The server answered with fewer bytes than the value it holds (a proxy or a network fault
    cut the reply): a failed read, not a damaged entry."""


class RedisTier(ByteTier):
    """Byte tier on a Redis server or cluster, namespaced by ``prefix``; ``kv_format``: how K
    and V are stored (``ByteTier``)."""

    name = "redis"

    def __init__(self, url: str, prefix: str = "blendrag:kv:", ttl_s: int | None = None,
                 timeout_s: float = 5.0, *, kv_format: str = "model",
                 store_keys: StoreKeys | None = None, encrypt: bool = False) -> None:
        if redis is None:
            raise ImportError("the Redis tier needs redis-py: pip install 'blendrag[redis]'")
        super().__init__(kv_format, store_keys, encrypt)
        self.url = url
        self.prefix = prefix
        self.namespace = prefix.rstrip(":")
        if not self.namespace:
            raise ValueError(f"Redis prefix {prefix!r} names no namespace (it must not be empty "
                             "or only colons)")
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.cluster = False  # known once connected: whether the URL names a cluster node
        self._conn: redis.Redis | redis.RedisCluster | None = None
        self.errors: tuple[type[BaseException], ...] = (
            redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError,
            ShortReply)

    @property
    def label(self) -> str:
        return f"redis {'cluster' if self.cluster else 'tier'} at {self.url}"

    def open(self) -> None:
        """Connect (once) and check the server answers (raises when it does not)."""
        self._client.ping()

    @property
    def _client(self) -> redis.Redis | redis.RedisCluster:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> redis.Redis | redis.RedisCluster:
        """A client of the server at ``url``; of the whole cluster when it is a cluster node."""
        timeouts = {"socket_timeout": self.timeout_s, "socket_connect_timeout": self.timeout_s}
        plain = redis.Redis.from_url(self.url, **timeouts)
        try:
            enabled = plain.info("cluster").get("cluster_enabled") == 1
        except redis.exceptions.ResponseError as exc:
            plain.close()
            if "cluster mode" in str(exc):  # SELECT of the URL's database, refused by a cluster
                raise ValueError(f"{self.url} names a database other than 0, but the server is a "
                                 "Redis Cluster node, which has only database 0: drop the /N "
                                 "from the URL (use --redis-prefix to keep stores apart)") from None
            raise
        if not enabled:
            return plain
        plain.close()
        self.cluster = True
        return redis.RedisCluster.from_url(self.url, **timeouts)

    def unusable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the server cannot be used now (refused, cut or timed-out
        connection, a read-only replica) rather than that one command failed (a short reply,
        an error reply such as an out-of-memory refusal, descriptors exhausted)."""
        down = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ReadOnlyError, redis.exceptions.ClusterDownError,
                redis.exceptions.RedisClusterException, ConnectionError, TimeoutError)
        if isinstance(exc, down):
            return True
        return isinstance(exc, OSError) and not transient_os_error(exc)

    def fetch(self, key: str) -> bytes | None:
        """The stored bytes, or None; ``ShortReply`` when fewer came back than the server
        holds."""
        name = self._name(key)
        pipe = self._client.pipeline(transaction=True)  # both answers about the same value
        pipe.strlen(name)
        pipe.get(name)
        size, data = pipe.execute()
        if data is None:
            return None
        if len(data) != size:  # the client is made without decode_responses: replies are bytes
            raise ShortReply(f"GET {name} returned {len(data)} of the {size} bytes stored")
        return cast("bytes", data)

    def open_ranges(self, key: str) -> RedisRanges | None:
        """Positioned reads of the entry (GETRANGE), for layer-wise loading: only the bytes
        asked for cross the network. None when the key is absent."""
        return RedisRanges.open(self._client, self._name(key))

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data`` (with the tier's TTL); the server's own policy bounds its size."""
        self._client.set(self._name(key), data, ex=self.ttl_s)
        return True

    def contains(self, key: str) -> bool:
        return bool(self._client.exists(self._name(key)))

    def delete(self, key: str) -> None:
        self._client.delete(self._name(key))

    def clear(self, namespace_id: str = "") -> None:
        """Delete this store's keys of the namespace only (the server may be shared with other
        data and other namespaces)."""
        batch: list[bytes] = []
        for name in self._names(namespace_id):
            batch.append(name)
            if len(batch) >= _SCAN_BATCH:
                self._client.delete(*batch)
                batch.clear()
        if batch:
            self._client.delete(*batch)

    def usage(self) -> TierUsage:
        # Counting would scan the whole keyspace of a shared server: left to count_entries().
        return TierUsage(entries=None, used_bytes=None, budget_bytes=None)

    def count_entries(self, namespace_id: str = "") -> int:
        """Number of this store's entries of the namespace (a full SCAN: for tools, not the
        request path)."""
        return sum(1 for _ in self._names(namespace_id))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _name(self, key: str) -> str:
        """``{namespace}:{key}``; a namespaced key (``ns_id:digest``) is
        ``{namespace}:{ns_id}:{digest}``, so that each namespace has a prefix of its own."""
        ns_id, own = split(key)
        if ":" in own:
            raise ValueError(f"Redis tier keys must not contain ':' (the namespace delimiter): "
                             f"{key!r}")
        return f"{self.namespace}:{ns_id}:{own}" if ns_id else f"{self.namespace}:{own}"

    def _names(self, namespace_id: str = "") -> Iterator[bytes]:
        """The names of one namespace: ``{namespace}:`` (then ``{ns_id}:``) then a key without a
        colon (the SCAN pattern also matches nested namespaces' names, which are left out)."""
        base = f"{self.namespace}:{namespace_id}" if namespace_id else self.namespace
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", base) + ":*"
        start = len(base.encode()) + 1
        for name in self._client.scan_iter(match=pattern, count=_SCAN_BATCH):
            raw = name if isinstance(name, bytes) else str(name).encode()
            if b":" not in raw[start:]:
                yield name


class RedisRanges(RangeReader):
    """One Redis string read by byte ranges.

    Opening costs one round trip: STRLEN and the first ``head`` bytes (the safetensors header
    of an entry, token ids and checksums included, fits in 64 KiB up to some 5,000 tokens) in
    one transaction; each later read is one GETRANGE per run of adjacent tensors. The string may
    be replaced or evicted between reads: a range then comes back short or with other bytes,
    which the codec reports as a truncated entry or a checksum mismatch (the store deletes the
    entry only when a fresh read fails too). A range that comes back short while the server
    still holds a value of the size opened lost bytes on the way: ``ShortReply``."""

    HEAD = 64 << 10

    def __init__(self, client, name: str, size: int, head: bytes) -> None:
        self._client, self._name, self.size, self._head = client, name, size, head

    @classmethod
    def open(cls, client, name: str) -> RedisRanges | None:
        pipe = client.pipeline(transaction=True)  # both answers about the same value
        pipe.strlen(name)
        pipe.getrange(name, 0, cls.HEAD - 1)
        size, head = pipe.execute()
        if not size:
            return None
        if len(head) != min(int(size), cls.HEAD):
            raise ShortReply(f"GETRANGE {name} returned {len(head)} bytes of the first "
                             f"{min(int(size), cls.HEAD)} of {size}")
        return cls(client, name, int(size), bytes(head))

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= len(self._head):
            return self._head[offset:end]
        if end <= offset:
            return b""
        data = bytes(self._client.getrange(self._name, offset, end - 1))
        if len(data) < end - offset and self._client.strlen(self._name) == self.size:
            raise ShortReply(f"GETRANGE {self._name} returned {len(data)} of {end - offset} "
                             "bytes")
        return data

    def read_into_many(self, offset: int, bufs: list[memoryview]) -> int:
        return scatter(self.read(offset, sum(len(b) for b in bufs)), bufs)

    def close(self) -> None:
        self._head = b""
