"""FlexAttention for scattered queries (engine/compute/attention.py's ``FlexPlan``): the
compiled kernel (once per process, ``dynamic``: one compile serves every request's query and
key counts) and the block masks built on the device from the sorted query positions."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

FLEX_BLOCK = 128  # FlexAttention's tile, queries and keys


def block_mask_rows(pos: torch.Tensor, n: int, keys: int, window: int | None, rows: int):
    """FlexAttention's ``BlockMask`` of queries at ``pos`` over ``keys`` key rows, the queries
    padded to ``rows`` (>= their number; the padding rows repeat the last position):
    ``attention.FlexPlan`` pads them to whole tiles, at least two (``attention.pad_rows``); the
    GPU check's attention phase tries other paddings."""
    from torch.nn.attention.flex_attention import BlockMask

    a, dev, b = pos.shape[0], pos.device, FLEX_BLOCK
    if rows < a:
        raise ValueError(f"a block mask for {a} queries needs at least {a} rows, got {rows}")
    tiles, kv_blocks = -(-rows // b), -(-keys // b)
    # every query of a tile gets a position: the padding repeats the last one
    qpos = torch.cat([pos, pos[-1:].expand(tiles * b - a)])  # [tiles * b]
    first, last = qpos[::b], qpos[b - 1::b]  # [tiles] each
    w = window if window is not None else n + 1
    # keys seen by every query of a tile: [last - w + 1, first]; by some query: [first - w + 1,
    # last]
    starts = torch.arange(kv_blocks, device=dev) * b  # [KB]
    ends = starts + b - 1
    full = (starts[None] >= (last - w + 1)[:, None]) & (ends[None] <= first[:, None])
    seen = (ends[None] >= (first - w + 1)[:, None]) & (starts[None] <= last[:, None])
    partial = seen & ~full  # [tiles, KB]

    def packed(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the blocks of each tile in ascending order, those in the set first
        count = m.sum(-1, dtype=torch.int32)[None, None]  # [1, 1, tiles]
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)
        return count, order.to(torch.int32)[None, None]  # [1, 1, tiles, KB]

    # two mask functions, not one with a window of n + 1: a number captured by the function
    # is part of the compiled kernel, and n changes with every request
    def causal(b_, h_, q_idx, kv_idx):
        return kv_idx <= qpos[q_idx]

    def windowed(b_, h_, q_idx, kv_idx):
        p = qpos[q_idx]
        return (kv_idx <= p) & (kv_idx > p - window)

    kv_num, kv_idx = packed(partial)
    full_num, full_idx = packed(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=b,
                                    mask_mod=causal if window is None else windowed,
                                    seq_lengths=(rows, keys), compute_q_blocks=False)


_FLEX: list[Callable | None] = []  # the compiled FlexAttention, once per process (None: off)


def flex_kernel() -> Callable | None:
    """The compiled FlexAttention this process runs, or None when it is not usable here
    (``disable_flex``)."""
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        # dynamic: one compile serves every request's query and key counts
        _FLEX.append(torch.compile(flex_attention, dynamic=True))
    return _FLEX[0]


def disable_flex(exc: Exception) -> None:
    """FlexAttention off for the rest of the process, said once (``exc``: why)."""
    log.warning("FlexAttention is not usable here (%s: %s); scattered queries take the row "
                "blocks of the sdpa kernel instead (exact, slower on a GPU)",
                type(exc).__name__, exc)
    _FLEX[:] = [None]
