"""The KV pool's accounting: running requests' KV rows counted in fixed blocks.

Each running request holds its prompt's and its answer's rows (``ServingConfig.pool_tokens`` in
all). The rows themselves live in the request's own contiguous buffer (the layer loop's
attention kernels read one buffer per request; engine/compute/fused_kv.py): the pool decides
who may start and frees a request's blocks the moment it finishes, fails, times out or is
cancelled, so a request that leaves never holds memory another is waiting for.
"""

from __future__ import annotations

import threading


class BlockPool:
    """``blocks`` blocks of ``block_tokens`` rows."""

    def __init__(self, blocks: int, block_tokens: int) -> None:
        if blocks < 1 or block_tokens < 1:
            raise ValueError(f"a pool needs >= 1 block of >= 1 token, got {blocks} x "
                             f"{block_tokens}")
        self.blocks, self.block_tokens = blocks, block_tokens
        self._free = blocks
        self._lock = threading.Lock()

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` rows."""
        return -(-tokens // self.block_tokens)

    def fits_ever(self, tokens: int) -> bool:
        """Whether ``tokens`` rows fit the whole pool."""
        return self.blocks_for(tokens) <= self.blocks

    def reserve(self, tokens: int) -> int | None:
        """Take the blocks of ``tokens`` rows: their count, or None when too few are free now."""
        need = self.blocks_for(tokens)
        with self._lock:
            if need > self._free:
                return None
            self._free -= need
            return need

    def free(self, blocks: int) -> None:
        """Give back ``blocks`` taken by ``reserve``."""
        with self._lock:
            if blocks < 0 or self._free + blocks > self.blocks:
                raise ValueError(f"freeing {blocks} blocks: {self._free} of {self.blocks} are "
                                 "free already")
            self._free += blocks

    @property
    def free_blocks(self) -> int:
        return self._free
