"""Print what opening a request's entries on the disk tier costs the host, and opening them and
reading every layer (docs/benchmarks.md, "Cached rows from the disk tier: the host's share"):
6 chunk entries of a random-weight model, the store's disk tier alone (page cache), medians.

Opening an entry reads and checks its header (strict JSON, every tensor's spec, the metadata
checksum) and hands its layers to the read-ahead pool; reading waits for every layer, read and
verified. Both run on the request's thread before and while its loop computes.

    .venv/bin/python scripts/disk_open.py
    .venv/bin/python scripts/disk_open.py --layers 16 --chunk-tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from blendrag.store import StoreConfig, TieredKVStore
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    w = TTFTWorkload(layers=args.layers, hidden=64, heads=4, kv_heads=2, intermediate=224,
                     vocab=1000, chunk_tokens=args.chunk_tokens)
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    with tempfile.TemporaryDirectory() as folder:
        store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=folder, disk_bytes=8 << 30))
        engine.store = store
        engine.precompute(layout.prefix_ids, layout.chunk_ids)
        keys = [engine.key(layout.prefix_ids, c) for c in layout.chunk_ids]
        opened, read = [], []
        for _ in range(args.runs + 5):
            t0 = time.perf_counter()
            entries = [store.open_layers(k) for k in keys]
            t1 = time.perf_counter()
            for e in entries:
                e.materialize()
            t2 = time.perf_counter()
            for e in entries:
                e.close()
            opened.append(t1 - t0)
            read.append(t2 - t0)
        store.close()
    print(f"{w.layers} layers, {len(keys)} x {w.chunk_tokens} chunk tokens, disk tier; median of "
          f"{args.runs} after 5: open {statistics.median(opened[5:]) * 1e3:.2f} ms, open and "
          f"read every layer {statistics.median(read[5:]) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
