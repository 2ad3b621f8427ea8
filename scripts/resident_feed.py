"""Print what a layer-feed reader thread costs a request whose cached rows are all in place
already (RAM on a CPU: docs/benchmarks.md, "A request whose rows are in place starts no
reader"): the same engine and prompt, alternated in one process between the feed as it is
(no reader for such rows) and the feed as it was (a reader started whatever the rows), call
by call, medians per mode.

    .venv/bin/python scripts/resident_feed.py
    .venv/bin/python scripts/resident_feed.py --layers 2 --calls 15
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from dataclasses import replace

from blendrag import BlendConfig
from blendrag.engine.compute import layer_feed
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout

MODES = {"reuse": BlendConfig(mode="reuse"),
         "epic@15%": BlendConfig(mode="blend", selector="epic", ratio=0.15),
         "default": BlendConfig()}


def with_reader(feed_init):
    """``LayerFeed.__init__`` as it was: a reader thread for every feed with rows."""

    def init(self, segments, num_layers, fused, rope, depth=0, place_ahead=True):
        feed_init(self, segments, num_layers, fused, rope, 0, place_ahead)
        if depth and self.segments:
            self.depth, self.place_ahead = depth, place_ahead
            self._queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    return init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per mode and round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    w = TTFTWorkload(layers=args.layers)
    engine = build_engine(w)
    engine.threads = 1  # the engine's default on a CPU
    layout = random_layout(w, engine.model.config.vocab_size)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)
    engine.loading = replace(engine.loading, full_when_faster=False, full_when_missing=None)
    now, before = layer_feed.LayerFeed.__init__, with_reader(layer_feed.LayerFeed.__init__)
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for name, config in MODES.items():
                engine.prefill(layout, config)
                for _ in range(args.calls):  # the two feeds call by call: paired in time
                    for variant, init in (("reader", before), ("no reader", now)):
                        layer_feed.LayerFeed.__init__ = init
                        t0 = time.perf_counter()
                        engine.prefill(layout, config)
                        times.setdefault((name, variant), []).append(time.perf_counter() - t0)
    finally:
        layer_feed.LayerFeed.__init__ = now
    print(f"{args.layers} layers, hidden {w.hidden}, {w.chunks} x {w.chunk_tokens} tokens, "
          f"1 thread; median of {args.calls * args.rounds} calls (ms)")
    for name in MODES:
        a, b = (statistics.median(times[(name, v)]) * 1e3 for v in ("reader", "no reader"))
        print(f"{name:<10} reader {a:8.1f}   no reader {b:8.1f}   {b / a - 1:+.1%}")


if __name__ == "__main__":
    main()
