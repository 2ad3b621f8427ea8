"""Bases for a tier or a layered entry that wraps another and changes some of its calls: every
other call is forwarded, one declared method or property at a time, so that a type checker sees
each (no ``__getattr__``).

- ``TierWrapper``: a ``Tier`` over ``inner`` (``throttle.ThrottledTier``; ``TieredKVStore``'s
  ``wrap`` hook takes one).
- ``LayeredEntryWrapper`` (defined beside the protocol it forwards, ``layered.py``): a
  ``LayeredEntry`` over ``inner`` (``counted.CountedLayeredEntry``,
  ``throttle.ThrottledLayers``, the request path's per-request counting).
"""

from __future__ import annotations

from blendrag.store.codec import Entry
from blendrag.store.layered import LayeredEntry, LayeredEntryWrapper
from blendrag.store.protocol import TierUsage
from blendrag.store.tier import Tier

__all__ = ["LayeredEntryWrapper", "TierWrapper"]


class TierWrapper(Tier):
    """``inner`` as it is, call for call; a subclass overrides the calls it changes."""

    def __init__(self, inner: Tier) -> None:
        self.inner = inner
        self.name, self.errors, self.volatile = inner.name, inner.errors, inner.volatile

    @property
    def label(self) -> str:
        return self.inner.label  # may change once opened (a Redis URL naming a cluster)

    def open(self) -> object:
        return self.inner.open()

    def read(self, key: str) -> tuple[Entry, int] | None:
        return self.inner.read(key)

    def open_layers(self, key: str) -> LayeredEntry | None:
        return self.inner.open_layers(key)

    def write(self, entry: Entry) -> int:
        return self.inner.write(entry)

    def contains(self, key: str) -> bool:
        return self.inner.contains(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def clear(self, namespace_id: str = "") -> None:
        self.inner.clear(namespace_id)

    def usage(self) -> TierUsage:
        return self.inner.usage()

    def unusable(self, exc: BaseException) -> bool:
        return self.inner.unusable(exc)

    def close(self) -> None:
        self.inner.close()
