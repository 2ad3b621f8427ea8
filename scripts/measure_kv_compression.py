#!/usr/bin/env python
"""Would a general-purpose compressor pay for the network tiers? On the default model's real KV
(the first MuSiQue item's first chunks, stored as bfloat16, the default format), zstd at levels
1 and 3, with and without a byte shuffle (each value's low bytes, then its high bytes: the
exponents sit together and compress), one thread: the size ratio and the compress and
decompress speeds, best of 3, in GB/s of bfloat16 KV.

Usage: ``python scripts/measure_kv_compression.py [--chunks 4]`` (needs ``zstandard``).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import zstandard

from blendrag import BlendEngine
from blendrag_bench.datasets import load_musique


def kv_bytes(chunks: int) -> bytes:
    """bfloat16 K and V of the first item's first ``chunks`` chunks, as stored."""
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct", threads=1)
    item = load_musique(limit=1)[0]
    layout = engine.build_prompt(item.prefix, item.chunks[:chunks], item.suffix)
    parts = []
    for ids in layout.chunk_ids:
        kv = engine.cache.kv(layout.chunk_prefix_ids, ids)
        for t in (kv.keys, kv.values):  # [layers, kv_heads, T, head_dim]
            parts.append(t.to(torch.bfloat16).contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def shuffle(data: bytes) -> bytes:
    """Low bytes of every 2-byte value, then the high bytes."""
    return np.frombuffer(data, np.uint8).reshape(-1, 2).T.copy().tobytes()


def unshuffle(data: bytes) -> bytes:
    """``shuffle``'s inverse."""
    return np.frombuffer(data, np.uint8).reshape(2, -1).T.copy().tobytes()


def best_of(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=4, help="chunks of KV (default: 4)")
    args = p.parse_args()
    torch.set_num_threads(1)
    data = kv_bytes(args.chunks)
    gbps = lambda s: len(data) / s / 1e9  # noqa: E731
    print(f"bfloat16 KV: {len(data) / 1e6:.1f} MB")
    print(f"{'codec':<22}{'ratio':>7}{'compress GB/s':>15}{'decompress GB/s':>17}")
    for level in (1, 3):
        for shuffled in (False, True):
            src = shuffle(data) if shuffled else data
            packed = zstandard.ZstdCompressor(level=level).compress(src)
            if shuffled and unshuffle(src) != data:
                raise RuntimeError("unshuffle is not the inverse of shuffle")
            unpack = zstandard.ZstdDecompressor()
            pack_s = best_of(lambda lv=level, s=src: zstandard.ZstdCompressor(level=lv).compress(s))
            unpack_s = best_of(lambda u=unpack, b=packed: u.decompress(b))
            if shuffled:  # the unshuffle is part of a read
                unpack_s += best_of(lambda s=src: unshuffle(s))
                pack_s += best_of(lambda: shuffle(data))
            name = f"zstd-{level}" + (" + shuffle" if shuffled else "")
            print(f"{name:<22}{len(data) / len(packed):>7.3f}{gbps(pack_s):>15.2f}"
                  f"{gbps(unpack_s):>17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
