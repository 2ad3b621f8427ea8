"""The one interface of a tier, a level of a ``TieredKVStore`` (RAM, disk, Redis or a Redis
Cluster, S3), and the base of the tiers that store entries as encoded bytes.

``Tier`` is what the store calls, through the tier's ``TierSlot`` (``slot.py``, which counts
every call and turns a failure into a miss). ``RamTier`` (``ram.py``) holds decoded entries;
``DiskTier``, ``RedisTier`` and ``S3Tier`` are ``ByteTier``s: each gives a few byte operations
(``fetch``, ``put``, ``contains``, ...) and ``ByteTier`` makes the entry operations of them,
entries encoded on the way in, decoded and verified on the way out (``codec.py``). Wrappers
(``wrappers.TierWrapper``: ``throttle.ThrottledTier``) are tiers too.

What a tier can do beyond the required operations is declared, never probed: ``volatile``, and
methods with a default here that a tier overrides (``open``, ``unusable``, ``close``,
``ByteTier.open_ranges``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import BinaryIO

from blendrag.store.auth import StoreKeys
from blendrag.store.codec import Entry, decode, open_entry
from blendrag.store.config import KV_FORMATS
from blendrag.store.layered import EncodedLayeredEntry, LayeredEntry
from blendrag.store.protocol import TierUsage
from blendrag.store.readers import RangeReader, reader_of
from blendrag.store.sealed import seal, unseal


class Tier(ABC):
    """One level of a ``TieredKVStore``.

    ``read`` returns the entry and the bytes it read, or None; it raises ``EntryError`` for an
    entry whose bytes fail a check and one of ``errors`` for a storage failure; ``unusable``
    says whether such a failure means the tier as a whole cannot be used now. ``write`` returns
    the bytes stored, 0 when the entry does not fit."""

    name: str  # "ram", "disk", "redis", "s3": the tier's name in stats
    # What a storage failure raises (each counts against the tier: ``health.TierHealth``).
    errors: tuple[type[BaseException], ...] = ()
    # Lives in this process's memory: bulk writes skip it when a persistent tier takes the entry.
    volatile: bool = False
    # Signs what it writes and authenticates what it reads (a ``ByteTier`` given ``keys``): an
    # entry failing any check is then a forgery, never deleted (``slot.py``).
    authenticated: bool = False

    @property
    @abstractmethod
    def label(self) -> str:
        """The tier and where it is, for messages ("disk tier at /path")."""

    def open(self) -> object:
        """Connect or open now (raises one of ``errors`` when the tier cannot be used), so a
        broken tier is reported at start-up; tiers with nothing to open keep this default."""
        return None

    @abstractmethod
    def read(self, key: str) -> tuple[Entry, int] | None:
        """The whole entry for ``key`` and the bytes read, or None."""

    @abstractmethod
    def open_layers(self, key: str) -> LayeredEntry | None:
        """The entry for ``key`` opened for layer-wise reads (``layered.py``), or None."""

    @abstractmethod
    def write(self, entry: Entry) -> int:
        """Store ``entry``; the bytes stored, 0 when it does not fit."""

    @abstractmethod
    def contains(self, key: str) -> bool:
        """Whether ``key`` is held (loads nothing, is not a use)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Drop ``key`` if held."""

    @abstractmethod
    def clear(self, namespace_id: str = "") -> None:
        """Drop every entry of the namespace ``namespace_id`` (``names.py``: "" the default
        one) in this tier; other namespaces' entries, and other data sharing the storage,
        stay."""

    @abstractmethod
    def usage(self) -> TierUsage:
        """What the tier holds now."""

    def unusable(self, exc: BaseException) -> bool:
        """Whether the storage failure ``exc`` means the tier as a whole cannot be used now
        (benched at once) rather than that one operation failed (a strike). By default one
        operation failed: a tier that knows its failures better overrides this."""
        return False

    def close(self) -> None:
        """Release files and connections; tiers that hold none keep this default."""
        return None


class ByteTier(Tier):
    """A tier that stores each entry as its encoded bytes (disk, Redis, S3): a subclass gives
    the byte operations (``fetch``, ``put``, and ``open_ranges`` where it can read part of an
    entry), and the entry operations are made of them here.

    ``kv_format``: how K and V are stored (``config.KV_FORMATS``; "model": the model's dtype).
    ``store_keys``: sign every entry written and authenticate every entry read (``auth.py``);
    ``encrypt``: also encrypt entries at rest with keys derived from them (``sealed.py``; an
    encrypted entry is fetched whole)."""

    def __init__(self, kv_format: str = "model", store_keys: StoreKeys | None = None,
                 encrypt: bool = False) -> None:
        if kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format must be one of {', '.join(KV_FORMATS)}, "
                             f"got {kv_format!r}")
        if encrypt and store_keys is None:
            raise ValueError("an encrypted tier needs store keys")
        self.kv_format = kv_format
        self.store_keys = store_keys
        self.encrypt = encrypt
        self.authenticated = store_keys is not None

    @abstractmethod
    def fetch(self, key: str) -> bytes | BinaryIO | None:
        """The stored bytes of ``key`` (or an open entry file, which the caller closes), or
        None."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key``; False when it does not fit."""

    def open_ranges(self, key: str) -> RangeReader | None:
        """The entry opened for positioned reads (layer-wise loading), or None when absent.
        By default the whole entry is fetched (a disk tier's open file, read by ``pread``); a
        tier that can read byte ranges remotely (Redis GETRANGE, S3 ranged GET) overrides
        this, so only the bytes asked for are moved."""
        source = self._fetch(key)
        return None if source is None else reader_of(source)

    def read(self, key: str) -> tuple[Entry, int] | None:
        """The entry fetched whole, decoded and verified, and its stored size."""
        source = self._fetch(key)
        if source is None:
            return None
        if isinstance(source, bytes):
            return Entry(key, decode(source, key, self.store_keys), source), len(source)
        with source:  # an open entry file
            size = os.fstat(source.fileno()).st_size
            return Entry(key, decode(source, key, self.store_keys)), size

    def _fetch(self, key: str) -> bytes | BinaryIO | None:
        """``fetch``, the entry decrypted when this tier encrypts (then always bytes)."""
        source = self.fetch(key)
        if not self.encrypt or source is None or self.store_keys is None:
            return source
        if not isinstance(source, bytes):
            with source:
                source = source.read()
        return unseal(source, key, self.store_keys)

    def open_layers(self, key: str) -> EncodedLayeredEntry | None:
        """The entry opened for layer-wise reads: header and priors read and verified now,
        each layer when asked for."""
        source = self.open_ranges(key) if not self.encrypt else self._fetch(key)
        if source is None:
            return None
        # open_entry closes the source when the header is bad
        reader = open_entry(source, key, self.store_keys)
        try:
            return EncodedLayeredEntry(reader, key, self.name)
        except BaseException:
            reader.close()
            raise

    def write(self, entry: Entry) -> int:
        """Store ``entry`` encoded in ``kv_format`` (the bytes it was read from, where it was)."""
        data = entry.encoded(self.kv_format, self.store_keys)
        if self.encrypt and self.store_keys is not None:
            data = seal(data, entry.key, self.store_keys)
        return len(data) if self.put(entry.key, data) else 0
