"""Bases for a tier or a layered entry that wraps another and changes some of its calls: every
other call is forwarded, one declared method or property at a time, so that a type checker sees
each (no ``__getattr__``).

- ``TierWrapper``: a ``Tier`` over ``inner`` (``throttle.ThrottledTier``; ``TieredKVStore``'s
  ``wrap`` hook takes one).
- ``LayeredEntryWrapper``: a ``LayeredEntry`` over ``inner`` (``counted.CountedLayeredEntry``,
  ``throttle.ThrottledLayers``). The header fields are copied when it is made: they are fixed
  once an entry is open.
"""

from __future__ import annotations

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import Entry
from blendrag.store.layered import LayeredEntry
from blendrag.store.protocol import TierUsage
from blendrag.store.tier import Tier


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


class LayeredEntryWrapper:
    """``inner`` as it is; a subclass overrides the reads it changes (``layer``,
    ``materialize``, ``close``)."""

    def __init__(self, inner: LayeredEntry) -> None:
        self.inner = inner
        self.key, self.tier, self.exact = inner.key, inner.tier, inner.exact
        self.token_ids, self.prefix_hash = inner.token_ids, inner.prefix_hash
        self.context_tag = inner.context_tag
        self.profile, self.context_shift = inner.profile, inner.context_shift

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.inner.shape  # [L, Hkv, T, D]

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def num_tokens(self) -> int:
        return self.inner.num_tokens

    @property
    def num_layers(self) -> int:
        return self.inner.num_layers

    @property
    def layer_nbytes(self) -> int:
        return self.inner.layer_nbytes

    @property
    def stored_layer_nbytes(self) -> int:
        return self.inner.stored_layer_nbytes

    @property
    def complete(self) -> bool:
        return self.inner.complete

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.layer(i)  # each [Hkv, T, D]

    def materialize(self) -> ChunkKV:
        return self.inner.materialize()

    def close(self) -> None:
        self.inner.close()
