"""Print what pipelined loading gains or loses against sequential loading, on the CPU, rows in
the RAM tier (docs/benchmarks.md, "The GPU check on an H100"): the same requests on two engines
that share one model and one store, one reading layers ahead on the feed's thread
(``LoadingConfig(prefetch_layers=4)``) and one placing them on the loop's thread (0),
alternated, medians.

When both threads are bound by the host (many small ops: a tiny model here, a 7B model's short
prompts on a GPU), the feed's thread and the loop's take turns on the interpreter and pipelining
loses; where compute dominates it is even.

    .venv/bin/python scripts/feed_overlap.py                                  # host-bound
    .venv/bin/python scripts/feed_overlap.py --layers 32 --hidden 512 --chunk-tokens 512
    .venv/bin/python scripts/feed_overlap.py --tier disk       # entries read from files

``--tier disk``: the entries are read from a disk tier's files (the page cache) at every request,
a layer (or a block of layers) at a time, by the shared read-ahead threads and the feed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.selection.controller import LoadingConfig
from blendrag.store import StoreConfig, TieredKVStore
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--tier", choices=("ram", "disk"), default="ram")
    args = parser.parse_args()
    w = TTFTWorkload(layers=args.layers, hidden=args.hidden, heads=8 if args.hidden >= 512 else 4,
                     kv_heads=2, intermediate=args.hidden * 7 // 2, vocab=1000,
                     chunk_tokens=args.chunk_tokens)
    base = build_engine(w)
    layout = random_layout(w, base.model.config.vocab_size)
    if args.tier == "disk":  # the disk tier alone: nothing is promoted to RAM
        base.store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tempfile.mkdtemp(),
                                               disk_bytes=8 << 30))
    engines = {depth: BlendEngine(base.model, None, store=base.store, threads=1,
                                  loading=LoadingConfig(prefetch_layers=depth,
                                                        full_when_faster=False))
               for depth in (0, 4)}
    engines[0].precompute(layout.prefix_ids, layout.chunk_ids)
    print(f"{w.layers} layers, hidden {w.hidden}, {w.chunks} x {w.chunk_tokens} chunk tokens, "
          f"{args.tier} tier, 1 thread; median of {args.runs} requests after 2")
    for config in (BlendConfig(mode="reuse"), BlendConfig(selector="cacheblend", ratio=0.15)):
        times: dict[int, list[float]] = {0: [], 4: []}
        for _ in range(args.runs + 2):
            for depth, engine in engines.items():
                t0 = time.perf_counter()
                engine.prefill(layout, config)
                times[depth].append(time.perf_counter() - t0)
        seq, pipe = (statistics.median(times[d][2:]) * 1e3 for d in (0, 4))
        print(f"{config.label:<24} sequential {seq:8.2f} ms  pipelined {pipe:8.2f} ms  "
              f"pipelined / sequential {pipe / seq:.2f}")


if __name__ == "__main__":
    main()
