"""S3 tier: entries as objects in an S3-compatible object store (AWS S3, Ceph RGW, MinIO, ...).

Each entry is one object ``{prefix}/{key}`` in the bucket of ``s3://bucket/prefix``. Keys never
contain a slash, so stores with different prefixes are disjoint: ``clear()`` and
``count_entries()`` list ``{prefix}/`` and touch only the objects directly under it.
Credentials and region come from boto3's usual chain (environment, ``~/.aws``, instance
role); ``endpoint_url`` names a server other than AWS's.

Whole reads are one GET; layer-wise reads (``open_ranges``) are ranged GETs fetched ahead of
the layer loop by a pool of threads (``s3_ranges.py``). Every layer is verified against its
checksum by the codec, as for the other tiers. A refused or timed-out connection, a missing
bucket or refused credentials bench the tier at once; a failed request (a 5xx, a short body)
counts a strike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from blendrag.store.auth import StoreKeys
from blendrag.store.names import split
from blendrag.store.protocol import TierUsage
from blendrag.store.s3_ranges import FetchPool, S3Ranges, ShortBody
from blendrag.store.tier import ByteTier

try:  # optional dependency: blendrag[s3]
    import boto3
    import botocore.config
    import botocore.exceptions
except ImportError:  # pragma: no cover - exercised only without the extra installed
    boto3 = None

# Failures that mean the tier cannot be used now, rather than that one request failed.
_UNUSABLE_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                   "SignatureDoesNotMatch", "ExpiredToken", "403", "404"}


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without surrounding slashes); ValueError for
    anything else (a prefix is required: it scopes ``clear()``)."""
    parts = urlparse(url)
    prefix = parts.path.strip("/")
    if parts.scheme != "s3" or not parts.netloc or not prefix:
        raise ValueError(f"an S3 store URL is s3://bucket/prefix (the prefix scopes clear()), "
                         f"got {url!r}")
    return parts.netloc, prefix


class S3Tier(ByteTier):
    """Byte tier on an S3 bucket, namespaced by the URL's prefix; ``read_ahead``: threads that
    fetch an open entry's layers ahead (0: each layer fetched when asked for); ``kv_format``:
    how K and V are stored (``ByteTier``)."""

    name = "s3"

    def __init__(self, url: str, endpoint_url: str | None = None, timeout_s: float = 5.0,
                 read_ahead: int = 8, *, kv_format: str = "model",
                 store_keys: StoreKeys | None = None, encrypt: bool = False) -> None:
        if boto3 is None:
            raise ImportError("the S3 tier needs boto3: pip install 'blendrag[s3]'")
        super().__init__(kv_format, store_keys, encrypt)
        self.url, self.endpoint_url = url, endpoint_url
        self.bucket, self.prefix = parse_s3_url(url)
        config = botocore.config.Config(
            connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 2},
            max_pool_connections=max(10, read_ahead + 2),
            s3={"addressing_style": "path"} if endpoint_url else None)
        self._client: Any = boto3.session.Session().client("s3", endpoint_url=endpoint_url,
                                                           config=config)
        self._pool = FetchPool(read_ahead) if read_ahead > 0 else None
        self.errors: tuple[type[BaseException], ...] = (
            botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError,
            ShortBody)

    @property
    def label(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3 tier {self.url}{where}"

    def open(self) -> None:
        """Check the bucket is there and readable (raises when it is not)."""
        self._client.head_bucket(Bucket=self.bucket)

    def unusable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store cannot be used now (no connection, a missing bucket,
        refused credentials) rather than that one request failed."""
        if isinstance(exc, botocore.exceptions.ClientError):
            return exc.response.get("Error", {}).get("Code") in _UNUSABLE_CODES
        down = (botocore.exceptions.EndpointConnectionError,
                botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError,
                botocore.exceptions.NoCredentialsError, ConnectionError, TimeoutError)
        return isinstance(exc, down)

    def fetch(self, key: str) -> bytes | None:
        """The stored bytes, or None; ``ShortBody`` when fewer came back than the object holds."""
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=self._name(key))
        except self._client.exceptions.NoSuchKey:
            return None
        data = reply["Body"].read()
        if len(data) != reply["ContentLength"]:
            raise ShortBody(f"GET {self._name(key)} returned {len(data)} of "
                            f"{reply['ContentLength']} bytes")
        return data

    def open_ranges(self, key: str) -> S3Ranges | None:
        """The object opened for ranged reads (layer-wise loading); None when absent."""
        return S3Ranges.open(self._client, self.bucket, self._name(key), self._pool)

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data`` as one object; the bucket's lifecycle rules bound its size."""
        self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)
        return True

    def contains(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._name(key))
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._name(key))

    def clear(self, namespace_id: str = "") -> None:
        """Delete this store's objects of the namespace only (the bucket may hold other data
        and other namespaces)."""
        batch: list[dict] = []
        for name in self._names(namespace_id):
            batch.append({"Key": name})
            if len(batch) == 1000:  # DeleteObjects takes at most 1,000 keys
                self._delete(batch)
                batch = []
        if batch:
            self._delete(batch)

    def usage(self) -> TierUsage:
        # Counting would list the whole prefix: left to count_entries().
        return TierUsage(entries=None, used_bytes=None, budget_bytes=None)

    def count_entries(self, namespace_id: str = "") -> int:
        """Number of this store's objects of the namespace (a full listing: for tools, not the
        request path)."""
        return sum(1 for _ in self._names(namespace_id))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._client.close()

    def _name(self, key: str) -> str:
        """``{prefix}/{key}``; a namespaced key (``ns_id:digest``) is
        ``{prefix}/{ns_id}/{digest}``, so that each namespace has a prefix of its own."""
        ns_id, own = split(key)
        if "/" in key:
            raise ValueError(f"S3 tier keys must not contain '/' (the prefix delimiter): {key!r}")
        return f"{self.prefix}/{ns_id}/{own}" if ns_id else f"{self.prefix}/{own}"

    def _names(self, namespace_id: str = "") -> Iterator[str]:
        """Objects directly under ``{prefix}/`` (then ``{ns_id}/``): one namespace's (a nested
        prefix's objects are left out)."""
        base = f"{self.prefix}/{namespace_id}" if namespace_id else self.prefix
        start = len(base) + 1
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{base}/")
        for page in pages:
            for item in page.get("Contents", []):
                if "/" not in item["Key"][start:]:
                    yield item["Key"]

    def _delete(self, batch: list[dict]) -> None:
        reply = self._client.delete_objects(Bucket=self.bucket,
                                            Delete={"Objects": batch, "Quiet": True})
        if reply.get("Errors"):
            first = reply["Errors"][0]
            raise OSError(f"S3 refused to delete {len(reply['Errors'])} objects, e.g. "
                          f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")
