"""The one configuration object of the persistent KV store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from blendrag.checks import check_at_least
from blendrag.store.auth import StoreKeys
from blendrag.store.names import Names, check_namespace, check_tenant_namespace

# A per-user directory, shared by every process of that user (diskcache is process-safe).
DEFAULT_DISK_DIR = Path.home() / ".cache" / "blendrag" / "kv"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
KV_FORMATS = ("model", "bfloat16", "float16", "int8")
"""How K and V may be stored: the model's dtype (exact), a 16-bit float, or int8 with scales
(K per channel, V per token); every format is decoded to the model's dtype as it is read
(``store/entry_reader.py``)."""


@dataclass
class StoreConfig:
    """Tiers of a ``TieredKVStore``; a tier is off when its size/location is 0/None.

    ram_bytes:     budget of the in-process LRU (0 = no RAM tier)
    disk_dir:      diskcache directory (None = no disk tier)
    disk_bytes:    budget of the disk tier, entry files plus the SQLite index
    disk_timeout_s: how long a writer waits for another process's lock before giving up
    redis_url:     shared tier, e.g. "redis://127.0.0.1:6379/0" (None = no Redis tier)
    redis_prefix:  namespace of this store's keys on the Redis server: names are
                   ``{prefix less trailing colons}:{key}``, disjoint from other namespaces
    redis_ttl_s:   expiry of Redis entries (None = bounded by the server's maxmemory policy)
    redis_timeout_s: socket timeout of Redis calls
    s3_url:        object-store tier, "s3://bucket/prefix" (None = no S3 tier); credentials and
                   region from boto3's chain (environment, ~/.aws, instance role)
    s3_endpoint_url: the S3 server when it is not AWS's, e.g. "http://127.0.0.1:7480" (Ceph
                   RGW, MinIO)
    s3_timeout_s:  connect and read timeout of S3 requests
    retry_after_s: a tier that failed (read-only/full disk, Redis down) is skipped this long
    kv_format:     how the persistent tiers store K and V: "model" (the model's dtype,
                   exact), "bfloat16", "float16" or "int8" (K scaled per channel, V per token);
                   decoded to the model's dtype as each layer is read. Entries of any format
                   are read whatever this says (it is recorded in each entry's header).
                   The default, "bfloat16", is the smallest format within the fidelity budget
                   on the quality benchmark (docs/store.md); it keeps the float32 exponent
                   range, so no model's activations overflow it, and a bfloat16 model's KV is
                   stored exactly. The RAM tier always holds the model's dtype.
    namespace:     the tenant (or tenant/user) this store reads and writes for, set by the
                   application, never by request text: its entries are apart from every other
                   namespace's, under a physical prefix of their own in each shared tier
                   (``names.py``); "" the default namespace (``store.namespaced(ns)`` gives
                   another namespace's view of the same tiers)
    public_namespace: a namespace every namespace also reads (never writes): a corpus the
                   ingestion job shares with every tenant, written by that job alone (through
                   ``store.namespaced(public_namespace)``); never a tenant's namespace
                   (``engine.namespaced`` refuses it: ``names.check_tenant_namespace``); None:
                   none shared
    auth_key:      the deployment's ``StoreKeys`` (``StoreKeys.from_env()``, ``from_file``):
                   every entry a byte tier writes is signed and every read verified before
                   use; a forged, foreign or unsigned entry is a miss, never used, promoted,
                   deleted or overwritten (``auth.py``). Stored names are keyed with it. None:
                   entries are trusted as today (checksums catch damage, not forgery)
    encrypt:       also encrypt entries at rest in the byte tiers (AES-256-GCM, the stored
                   name as associated data; needs ``auth_key`` and ``pip install
                   blendrag[crypto]``); an encrypted entry is read whole, not layer by layer
    """

    ram_bytes: int = 4 << 30
    disk_dir: str | Path | None = DEFAULT_DISK_DIR
    disk_bytes: int = 64 << 30
    disk_timeout_s: float = 10.0
    redis_url: str | None = None
    redis_prefix: str = "blendrag:kv:"
    redis_ttl_s: int | None = None
    redis_timeout_s: float = 5.0
    s3_url: str | None = None
    s3_endpoint_url: str | None = None
    s3_timeout_s: float = 5.0
    retry_after_s: float = 60.0
    kv_format: str = "bfloat16"
    namespace: str = ""
    public_namespace: str | None = None
    auth_key: StoreKeys | None = None
    encrypt: bool = False

    def __post_init__(self) -> None:
        if self.kv_format not in KV_FORMATS:
            raise ValueError(f"StoreConfig.kv_format must be one of {', '.join(KV_FORMATS)}, "
                             f"got {self.kv_format!r}")
        for name in ("ram_bytes", "disk_bytes"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise ValueError(f"StoreConfig.{name} must be an int, got {getattr(self, name)!r}")
        if self.ram_bytes < 0:
            raise ValueError(f"StoreConfig.ram_bytes must be >= 0, got {self.ram_bytes}")
        if self.disk_bytes <= 0:
            raise ValueError(f"StoreConfig.disk_bytes must be positive, got {self.disk_bytes}")
        if self.disk_dir is not None:
            self.disk_dir = Path(self.disk_dir).expanduser()
        if self.redis_url is not None and not self.redis_url.startswith(_REDIS_SCHEMES):
            raise ValueError(f"StoreConfig.redis_url must start with one of {_REDIS_SCHEMES}, got "
                             f"{self.redis_url!r}")
        if not isinstance(self.redis_prefix, str) or not self.redis_prefix.rstrip(":"):
            raise ValueError("StoreConfig.redis_prefix must be a non-empty namespace (it scopes "
                             f"clear()), got {self.redis_prefix!r}")
        if self.redis_ttl_s is not None and self.redis_ttl_s <= 0:
            raise ValueError("StoreConfig.redis_ttl_s must be positive or None, got "
                             f"{self.redis_ttl_s}")
        if self.s3_url is not None:
            _check_s3_url(self.s3_url)
        if self.s3_endpoint_url is not None and not self.s3_endpoint_url.startswith(
                ("http://", "https://")):
            raise ValueError("StoreConfig.s3_endpoint_url must be an http:// or https:// URL, "
                             f"got {self.s3_endpoint_url!r}")
        for name in ("disk_timeout_s", "redis_timeout_s", "s3_timeout_s", "retry_after_s"):
            value = getattr(self, name)
            # NaN compares false with everything: a NaN bench would never end, a NaN timeout
            # never fire; an infinite one is as bad.
            check_at_least(f"StoreConfig.{name}", value)
        self._check_security()
        if (self.ram_bytes == 0 and self.disk_dir is None and self.redis_url is None
                and self.s3_url is None):
            raise ValueError("StoreConfig enables no tier: set ram_bytes, disk_dir, redis_url or "
                             "s3_url")

    def _check_security(self) -> None:
        check_namespace(self.namespace)
        if self.public_namespace is not None:
            check_namespace(self.public_namespace)
            check_tenant_namespace(self.namespace, self.public_namespace)
        if self.auth_key is not None and not isinstance(self.auth_key, StoreKeys):
            raise ValueError("StoreConfig.auth_key must be StoreKeys (StoreKeys.from_env(), "
                             f"StoreKeys.from_file(path)), got {type(self.auth_key).__name__}")
        if not isinstance(self.encrypt, bool):
            raise ValueError(f"StoreConfig.encrypt must be a bool, got {self.encrypt!r}")
        if self.encrypt:
            if self.auth_key is None:
                raise ValueError("StoreConfig.encrypt needs auth_key: the entries are "
                                 "encrypted with keys derived from it")
            from blendrag.store.sealed import require_cipher

            require_cipher()

    @property
    def names(self) -> Names:
        """How this store names its entries (its namespace, keyed with ``auth_key``)."""
        return Names(self.namespace, self.auth_key)

    def location(self) -> str | None:
        """Where entries outlive the process: the disk folder, the Redis URL and prefix, the S3
        URL and its server; None with none of them (RAM only). One recipe for every caller
        (a store's ``location()``, LlamaIndex's ingestion-cache key)."""
        if self.disk_dir is None and self.redis_url is None and self.s3_url is None:
            return None
        where = f"disk={self.disk_dir} redis={self.redis_url} prefix={self.redis_prefix}"
        if self.s3_url is not None:
            where += f" s3={self.s3_url}"
            if self.s3_endpoint_url is not None:
                where += f" at {self.s3_endpoint_url}"
        ns_id = self.names.ns_id
        return f"{where} ns={ns_id}" if ns_id else where


def _check_s3_url(url: str) -> None:
    """``s3://bucket/prefix``, the prefix not empty (it scopes ``clear()``)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/") if url.startswith("s3://") else (
        "", "", "")
    if not bucket or not prefix.strip("/"):
        raise ValueError(f"StoreConfig.s3_url must be s3://bucket/prefix (the prefix scopes "
                         f"clear()), got {url!r}")
