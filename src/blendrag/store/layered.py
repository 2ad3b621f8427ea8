"""Layer-wise reads of a stored chunk KV: the header at once, then one layer at a time.

A request's prefill asks for layer i of every cached chunk while it computes layer i - 1
(``engine/compute/layer_feed.py``), so a store hands out a ``LayeredEntry`` instead of a whole
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

Reading speed (disk entries in the page cache): a layer is one ``preadv`` straight into the
stacked buffer plus one xxh3-128 pass over it (tens of GB/s), and two things decide the rate.
The buffer: fresh pageable memory faults in 4 KiB at a time during the read (about 2 GB/s,
slower than the copy itself), so it is page-locked or huge-paged (``host_buffer``,
store/host_memory.py). And one thread copies from the page cache at a few GB/s: an entry whose
reader takes concurrent positioned reads (an entry file) has its layers read and verified ahead
by a small pool of threads shared by every entry (store/read_ahead.py), a block of a few
layers a task (``read_ahead.task_layers``: each task handed to the pool costs the opening
thread a queue put and a worker's wake-up, which at one per layer was more than a third of an
entry's opening). ``layer(i)`` returns once layer i is read and verified (its task's other
layers with it, when the task is under way), and raises that layer's own error, as if it had
read the layer itself (a task's other layers are read and judged on their own); a layer whose
task has not started is read by its caller, the task's other layers handed back to the pool
as a task of their own. ``close`` drops the reads not started and waits for those under way.
"""

from __future__ import annotations

import weakref
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from functools import partial
from typing import Protocol, runtime_checkable

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.entry_reader import EntryReader
from blendrag.store.host_memory import host_buffer
from blendrag.store.read_ahead import read_pool, task_layers


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


class LayeredEntryWrapper:
    """``inner`` as it is; a subclass overrides the reads it changes (``layer``,
    ``materialize``, ``close``). The header fields are copied when it is made: they are fixed
    once an entry is open."""

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
        self.exact = not kv.rounded  # (a rounded entry promoted from a slower tier: not)

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
        self._keys = host_buffer(self.shape, self.dtype)
        self._values = host_buffer(self.shape, self.dtype)
        self._read = [False] * self.num_layers
        # layer -> the read of its block by the shared pool (module docstring), whose result
        # is each layer's error or None; taken back by ``layer``
        self._ahead: dict[int, Future] = {}
        self._pool = read_pool() if reader.concurrent_reads else None
        if self._pool is not None:
            step = task_layers(self.num_layers, self.layer_nbytes)
            for start in range(0, self.num_layers, step):
                self._read_ahead(range(start, min(start + step, self.num_layers)))

    def _read_ahead(self, layers: range | list[int]) -> None:
        """Hand ``layers`` to the pool as one task, ranked by the first (the loop's order)."""
        if self._pool is None or not layers:
            return
        me = weakref.ref(self)  # a queued read keeps no entry (and no buffer) alive
        task = self._pool.submit(layers[0], partial(_read_layers, me, list(layers)))
        self._ahead.update(dict.fromkeys(layers, task))

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
            ahead = self._ahead.pop(i, None)
            if ahead is not None and not ahead.cancel():
                # read (or being read) by the pool: this layer's error is this read's
                error = ahead.result()[i]
                if error is not None:
                    raise error
            else:  # not started yet: read here, not behind others; the pool keeps the rest
                if ahead is not None:
                    self._read_ahead([j for j, f in self._ahead.items() if f is ahead])
                self._read_layer(i)
            self._read[i] = True
        return self._keys[i], self._values[i]

    def _read_layer(self, i: int) -> None:
        self._reader.layer_into(i, self._keys[i], self._values[i])

    def materialize(self) -> ChunkKV:
        for i in range(self.num_layers):
            self.layer(i)
        return ChunkKV(self._keys, self._values, self.token_ids, self.prefix_hash,
                       self.profile, self.context_tag, self.context_shift,
                       rounded=not self.exact)

    def close(self) -> None:
        # reads not started are dropped; those under way finish before the file is closed
        running = [f for f in self._ahead.values() if not f.cancel()]
        self._ahead.clear()
        wait_all(running)
        self._reader.close()


def _read_layers(entry: weakref.ref[EncodedLayeredEntry],
                 layers: list[int]) -> dict[int, BaseException | None]:
    """``layers`` of ``entry`` read by the pool, each on its own: each layer's error (None:
    read and verified); nothing read when the entry is gone (dropped without ``close``: no
    one asks)."""
    alive = entry()
    if alive is None:
        gone = RuntimeError("the entry was dropped before its layers were read")
        return dict.fromkeys(layers, gone)
    errors: dict[int, BaseException | None] = dict.fromkeys(layers)
    for i in layers:
        try:
            alive._read_layer(i)
        except Exception as exc:  # noqa: BLE001 - the reader of layer i raises it
            errors[i] = exc
    return errors
