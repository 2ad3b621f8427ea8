"""The prefix cache: the rows of finished requests, kept per block of tokens, so that a request
that begins as an earlier one began (the next turn of a chat: the same system prompt, passages
and history, then a new question) computes only the rest.

Blocks of ``block_tokens`` ids are keyed by a chain hash: a block's hash covers its parent's
hash and its own ids, so it names the whole prefix up to its end (as vLLM's automatic prefix
caching does); the first block's parent is the model's fingerprint. A request takes the longest
run of cached blocks its ids begin with. Rows are kept as the request's KV holds them, keys
rotated: a prefix sits at the same positions in every request that shares it.

Exactness is never blurred. A block is *exact* when every row up to its end was computed as a
full prefill computes it (a ``full`` or ``prefix`` request, the exact prefix of a ``blend``
request, or any request whose rows before the computed ones were exact); other blocks are
*approximate*. Exact blocks serve every request; approximate ones only requests that accept
approximation (``reuse``, ``blend``). An exact block replaces an approximate one of the same
prefix, never the reverse.

Blocks live on the engine's device within ``max_bytes``, the least recently used evicted first
(a chain's last blocks before its first, since a match touches them from the last); a block a
request holds is never evicted. With a ``store``, blocks also go to the persistent tiers (as
entries tagged ``prefix-block``), so another process finds a popular prefix. A block read from
the store is used only when its rows have the model's shape and dtype (``BlockShape``): any
other is a logged miss, as a chunk entry's is.

An engine's namespace views (``BlendEngine.namespaced``) each have a cache of their own
(``view``): their own root (the namespace enters every chain hash, and each block records the
root it was made under, compared on every take, so no block serves another namespace) and their
own store, over one pool of blocks within the engine's one budget, evicted least recently used
across them all.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.protocol import KVStore

log = logging.getLogger(__name__)

BLOCK_TAG = "prefix-block"  # context tag of a stored block: "prefix-block:exact" / ":approximate"


@dataclass(eq=False)
class Block:
    """One block's rows: k (rotated), v: [layers, kv_heads, block_tokens, head_dim]."""

    key: str
    ids: tuple[int, ...]
    k: torch.Tensor
    v: torch.Tensor
    exact: bool
    root: str = ""  # the root (model and namespace) its chain hash was made from
    users: int = 0

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass(frozen=True)
class BlockShape:
    """What a block's rows must be to be used: [layers, kv_heads, block_tokens, head_dim] in
    ``dtype``, on ``device`` (where a block read from the store is moved)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device | None = None

    def fits(self, kv: ChunkKV, tokens: int) -> bool:
        """Whether ``kv``'s keys and values are rows of ``tokens`` tokens of this shape."""
        want = (self.layers, self.kv_heads, tokens, self.head_dim)
        return all(tuple(t.shape) == want and t.dtype == self.dtype
                   for t in (kv.keys, kv.values))


class _Pool:
    """The blocks of every view of one cache, within one budget (``max_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.blocks: OrderedDict[str, Block] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.refused = 0  # stored blocks not used: rows of another shape or dtype
        self.lock = threading.Lock()


@dataclass
class PrefixMatch:
    """The cached blocks a request's ids begin with (held until ``release``): ``tokens`` rows,
    the first ``exact_tokens`` of them exact."""

    blocks: list[Block] = field(default_factory=list)
    tokens: int = 0
    exact_tokens: int = 0


class PrefixCache:
    """Blocks of ``block_tokens`` rows, at most ``max_bytes`` of them on the device.

    ``root()``: what the rows depend on besides the ids (the model's fingerprint, current when
    asked, and the namespace), the first block's parent. ``store``: also keep blocks in this
    store's tiers (None: in memory only). ``shape``: what a block read from the store must be
    (None: the shape of the blocks held, when there are any)."""

    def __init__(self, max_bytes: int, root: Callable[[], str], block_tokens: int = 32,
                 store: KVStore | None = None, shape: BlockShape | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"prefix cache bytes must be a positive int, got {max_bytes!r}")
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) \
                or block_tokens < 1:
            raise ValueError(f"block_tokens must be an int >= 1, got {block_tokens!r}")
        self.root, self.block_tokens = root, block_tokens
        self.store, self.shape = store, shape
        self._pool = _Pool(max_bytes)

    def view(self, root: Callable[[], str], store: KVStore | None) -> PrefixCache:
        """A cache for another namespace (``root`` and ``store`` its own) over this one's blocks
        and budget: its blocks and this one's never serve each other (their roots differ), and
        both are evicted least recently used within the one budget."""
        view = PrefixCache(self.max_bytes, root, self.block_tokens, store, self.shape)
        view._pool = self._pool
        return view

    @property
    def max_bytes(self) -> int:
        """The budget, shared by every view."""
        return self._pool.max_bytes

    @property
    def bytes(self) -> int:
        """Bytes of the blocks held now, every view's."""
        return self._pool.bytes

    def __len__(self) -> int:
        return len(self._pool.blocks)

    @property
    def refused(self) -> int:
        """Blocks read from the store and not used (rows of another shape or dtype than the
        model's: a miss), every view's."""
        return self._pool.refused

    def chain(self, ids: Sequence[int]) -> list[str]:
        """The chain hash of every whole block of ``ids``, in order."""
        keys, parent, b = [], self.root(), self.block_tokens
        for start in range(0, len(ids) - b + 1, b):
            h = xxhash.xxh3_128(parent.encode())
            h.update(np.asarray(ids[start:start + b], dtype="<i8").tobytes())
            parent = h.hexdigest()
            keys.append(parent)
        return keys

    # ---- a request ---------------------------------------------------------------------------

    def match(self, ids: Sequence[int], exact_only: bool) -> PrefixMatch:
        """The longest run of cached blocks ``ids`` begin with (only exact blocks when
        ``exact_only``), held by the caller until ``release``."""
        found = PrefixMatch()
        b, root = self.block_tokens, self.root()
        for i, key in enumerate(self.chain(ids)):
            block = self._take(key, tuple(ids[i * b:(i + 1) * b]), exact_only, root)
            if block is None:
                break
            found.blocks.append(block)
            found.tokens += b
            if block.exact and found.exact_tokens == found.tokens - b:
                found.exact_tokens += b
        self._touch_reversed([block.key for block in found.blocks])
        return found

    def release(self, match: PrefixMatch) -> None:
        with self._pool.lock:
            for block in match.blocks:
                block.users -= 1

    @staticmethod
    def copy_into(match: PrefixMatch, fused: FusedKV, tokens: int) -> None:
        """Write the first ``tokens`` rows of ``match`` into the request's KV: the blocks joined
        once and copied once, k and v each (two kernels whatever the number of blocks)."""
        blocks = match.blocks[:-(-tokens // match.blocks[0].k.shape[2])] if tokens else []
        if not blocks:
            return
        for dst, part in ((fused.k, [b.k for b in blocks]), (fused.v, [b.v for b in blocks])):
            rows = part[0] if len(part) == 1 else torch.cat(part, dim=2)  # [L, Hkv, B*b, D]
            dst[:, :, :tokens] = rows[:, :, :tokens]

    def insert(self, ids: Sequence[int], fused: FusedKV, exact_rows: int) -> None:
        """Keep the whole blocks of the first ``len(ids)`` rows of ``fused`` (the rows of
        ``ids``), exact up to ``exact_rows``; blocks held already stay, unless an exact block
        now replaces an approximate one."""
        b, keys, root = self.block_tokens, self.chain(ids), self.root()
        for i, key in enumerate(keys):
            exact = (i + 1) * b <= exact_rows
            with self._pool.lock:
                held = self._pool.blocks.get(key)
                if held is not None and held.root == root and (held.exact or not exact):
                    continue
            rows = slice(i * b, (i + 1) * b)
            block = Block(key, tuple(ids[rows]), fused.k[:, :, rows].clone(),
                          fused.v[:, :, rows].clone(), exact, root)
            self._add(block)
            if self.store is not None:
                # exact rows stay exact in the store: they serve full prefills
                self.store.put(_stored_key(key, exact), _as_entry(block), exact=exact)
        self._touch_reversed(keys)

    # ---- internals ---------------------------------------------------------------------------

    def _take(self, key: str, ids: tuple[int, ...], exact_only: bool,
              root: str) -> Block | None:
        """The block ``key`` (its ids and root compared: a hash collision is a miss), now held
        by the caller; from the store when memory lacks it."""
        with self._pool.lock:
            block = self._pool.blocks.get(key)
            if (block is not None and block.ids == ids and block.root == root
                    and (block.exact or not exact_only)):
                block.users += 1
                return block
        if self.store is None:
            return None
        block = self._load(key, ids, exact_only, root)
        if block is not None:
            with self._pool.lock:
                block.users += 1
        return block

    def _load(self, key: str, ids: tuple[int, ...], exact_only: bool,
              root: str) -> Block | None:
        """A block from the store (exact first), kept in memory; None when it holds neither,
        or holds rows of another shape or dtype (a logged miss: never used)."""
        for exact in (True,) if exact_only else (True, False):
            kv = self.store.get(_stored_key(key, exact)) if self.store is not None else None
            if kv is None or kv.token_ids != ids or kv.context_tag != _tag(exact):
                continue
            shape = self.shape or self._held_shape()
            if shape is not None and not shape.fits(kv, len(ids)):
                with self._pool.lock:
                    self._pool.refused += 1
                log.warning("stored prefix-cache block has rows %s %s, not the model's %s: a "
                            "miss, computed again", tuple(kv.keys.shape), kv.keys.dtype, shape)
                continue
            device = shape.device if shape is not None and shape.device else kv.keys.device
            block = Block(key, ids, kv.keys.to(device), kv.values.to(device), exact, root)
            self._add(block)
            return block
        return None

    def _held_shape(self) -> BlockShape | None:
        """The shape of a block held now (None: none held): what a cache without ``shape``
        checks a stored block against."""
        with self._pool.lock:
            like = next(iter(self._pool.blocks.values()), None)
        if like is None:
            return None
        layers, heads, _, dim = like.k.shape  # [L, Hkv, b, D]
        return BlockShape(layers, heads, dim, like.k.dtype, like.k.device)

    def _add(self, block: Block) -> None:
        pool = self._pool
        if block.nbytes > pool.max_bytes:
            return
        with pool.lock:
            old = pool.blocks.pop(block.key, None)
            if old is not None:  # its holders keep their reference to it
                pool.bytes -= old.nbytes
            pool.blocks[block.key] = block
            pool.bytes += block.nbytes
            self._evict()

    def _evict(self) -> None:
        """Drop least recently used blocks no request holds until the bytes fit (lock held),
        whichever view's they are."""
        pool = self._pool
        if pool.bytes <= pool.max_bytes:
            return
        for key in list(pool.blocks):
            if pool.bytes <= pool.max_bytes:
                return
            block = pool.blocks[key]
            if block.users == 0:
                del pool.blocks[key]
                pool.bytes -= block.nbytes

    def _touch_reversed(self, keys: list[str]) -> None:
        with self._pool.lock:
            for key in reversed(keys):
                if key in self._pool.blocks:
                    self._pool.blocks.move_to_end(key)


def _tag(exact: bool) -> str:
    return f"{BLOCK_TAG}:{'exact' if exact else 'approximate'}"


def _stored_key(key: str, exact: bool) -> str:
    """A block's store key: its chain hash and how its rows were made."""
    return xxhash.xxh3_128_hexdigest(f"{_tag(exact)}\0{key}".encode()) + key[:16]


def _as_entry(block: Block) -> ChunkKV:
    """A block as a stored entry (its keys rotated, unlike a chunk's: the tag says so)."""
    return ChunkKV(block.k, block.v, block.ids, "", None, _tag(block.exact))
