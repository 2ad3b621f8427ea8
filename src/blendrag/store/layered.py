"""Layer-wise reads of a stored chunk KV: the header at once, then one layer at a time.

A request's prefill asks for layer i of every cached chunk while it computes layer i - 1
(``engine/layer_feed.py``), so a store hands out a ``LayeredEntry`` instead of a whole
``ChunkKV``: its header fields (token ids, prefix hash, context tag, shape, dtype) and its small
priors (profile, context shift) are read and verified when it is opened, and ``layer(i)``
reads and verifies only layer i. The integrity unit is the layer: each of ``k.{i}`` and
``v.{i}`` is checked against its own checksum from the (checksummed) header before it is
returned, so a defect in layer k is found when layer k is read, and layers before it, already
used, were verified.

A read that fails after the entry was opened (a checksum mismatch, a tier that went away)
raises ``LayerReadError``: the rows of that layer do not exist, so the request cannot go on
with this entry (``BlendEngine.prefill`` redoes the request with the chunk recomputed).

- ``MemoryLayeredEntry``: over a ``ChunkKV`` held in memory (RAM tier, a chunk computed by
  this request): ``layer(i)`` returns views, nothing is read.
- ``EncodedLayeredEntry``: over the codec's ``EntryReader`` (disk: positioned reads on the
  entry file; Redis: GETRANGE of the layer's byte ranges), each layer read into its slot of
  one stacked buffer, so that a fully read entry is a ``ChunkKV`` without another copy.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import EntryReader


class LayerReadError(RuntimeError):
    """Layer ``layer`` of the entry ``key`` could not be read or failed its checksum after the
    entry was opened. The entry is unusable for this request; the store has dropped it (when a
    fresh read of its stored bytes fails a check too) or counted the failure against the tier
    it came from (a storage failure)."""

    def __init__(self, key: str, layer: int, cause: BaseException | str) -> None:
        super().__init__(f"layer {layer} of entry {key[:16]}: {cause}")
        self.key = key
        self.layer = layer


@runtime_checkable
class LayeredEntry(Protocol):
    """A stored chunk KV opened for layer-wise reading (see the module docstring)."""

    key: str
    tier: str  # where the layers come from: "ram", "disk", "redis", ... or "computed"
    token_ids: tuple[int, ...]
    prefix_hash: str
    context_tag: str
    profile: torch.Tensor | None
    context_shift: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int, int, int]: ...  # [L, Hkv, T, D]
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layer_nbytes(self) -> int: ...  # bytes of one layer's K and V, as read back
    @property
    def stored_layer_nbytes(self) -> int: ...  # the same layer where it is stored
    exact: bool  # the rows as computed (stored in the model's dtype)
    @property
    def complete(self) -> bool: ...  # every layer read already (materialize() costs nothing)
    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def materialize(self) -> ChunkKV: ...
    def close(self) -> None: ...


class _Shape:
    """Properties every layered entry derives from ``shape`` and ``dtype``."""

    shape: tuple[int, int, int, int]
    dtype: torch.dtype

    @property
    def num_tokens(self) -> int:
        return self.shape[2]

    @property
    def num_layers(self) -> int:
        return self.shape[0]

    @property
    def layer_nbytes(self) -> int:
        _, h, t, d = self.shape
        return 2 * h * t * d * self.dtype.itemsize

    @property
    def stored_layer_nbytes(self) -> int:
        """Bytes one layer takes where it is stored (what a read moves)."""
        return self.layer_nbytes

    exact = True  # whether the rows are as computed (not rounded to a smaller stored format)


def _four(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    layers, heads, tokens, dim = shape  # [L, Hkv, T, D]
    return layers, heads, tokens, dim


class MemoryLayeredEntry(_Shape):
    """A ``ChunkKV`` in memory as a layered entry: layers are views, reads cost nothing."""

    def __init__(self, kv: ChunkKV, key: str = "", tier: str = "ram") -> None:
        self.kv, self.key, self.tier = kv, key, tier
        self.token_ids, self.prefix_hash = kv.token_ids, kv.prefix_hash
        self.context_tag = kv.context_tag
        self.profile, self.context_shift = kv.profile, kv.context_shift
        self.shape = _four(tuple(kv.keys.shape))
        self.dtype = kv.keys.dtype

    complete = True  # nothing to read

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.keys[i], self.kv.values[i]  # [Hkv, T, D] views

    def materialize(self) -> ChunkKV:
        return self.kv

    def close(self) -> None:
        pass


class EncodedLayeredEntry(_Shape):
    """An encoded entry (disk, Redis) read layer by layer through an ``EntryReader``.

    ``layer(i)`` reads layer i into slot i of the stacked K and V ([L, Hkv, T, D], allocated
    at open: the same memory a whole-entry read takes) and verifies it; ``complete`` says
    whether every layer has been read, after which ``materialize`` is free. Raises
    ``EntryError`` or the tier's storage errors (the store turns them into
    ``LayerReadError``)."""

    def __init__(self, reader: EntryReader, key: str, tier: str) -> None:
        self._reader, self.key, self.tier = reader, key, tier
        self.token_ids, self.prefix_hash = reader.token_ids, reader.prefix_hash
        self.context_tag = reader.context_tag
        self.shape, self.dtype = _four(reader.shape), reader.dtype
        self.stored = reader.stored  # K and V as stored: the model's dtype, 16-bit or int8
        self.exact = self.stored == self.dtype
        self.profile, self.context_shift = reader.read_priors()
        self._keys = torch.empty(self.shape, dtype=self.dtype)
        self._values = torch.empty(self.shape, dtype=self.dtype)
        self._read = [False] * self.num_layers

    @property
    def complete(self) -> bool:
        return all(self._read)

    @property
    def stored_layer_nbytes(self) -> int:
        _, h, t, d = self.shape
        scales = 4 * h * (d + t) if self.stored == torch.int8 else 0  # K per channel, V per token
        return 2 * h * t * d * self.stored.itemsize + scales

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._read[i]:
            self._reader.layer_into(i, self._keys[i], self._values[i])
            self._read[i] = True
        return self._keys[i], self._values[i]

    def materialize(self) -> ChunkKV:
        for i in range(self.num_layers):
            self.layer(i)
        return ChunkKV(self._keys, self._values, self.token_ids, self.prefix_hash,
                       self.profile, self.context_tag, self.context_shift)

    def close(self) -> None:
        self._reader.close()
