"""Where a cached request's time goes, phase by phase, and two A/B checks of the fixed cost.

    python scripts/phase_breakdown.py --threads 2
    python scripts/phase_breakdown.py --threads 2 --ab buffers
    python scripts/phase_breakdown.py --threads 2 --ab blocks

The default workload of ``bench ttft`` (random Mistral-shaped 32 layers, 3,168 tokens). Without
``--ab``: one prefill timed by a ``PhaseClock`` per mode after a warm-up, ms per phase, and the
median
TTFT of ``--repeats`` untimed calls. ``--ab buffers``: the same with the engine's pooled request
buffer and with a fresh buffer per request (what the pool saves). ``--ab blocks``: attention
time of profile@15 % and reuse with masked-attention blocks of 16/32/64/128 rows, alternated,
minimum over ``--repeats`` (how ``attention.ROW_BLOCK``'s 64 was chosen). The figures quoted in
docs/benchmarks.md and docs/architecture.md, "The fixed cost of a cached request".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from blendrag import BlendConfig
from blendrag.engine.compute import attention
from blendrag.engine.compute.observers import PHASES, PhaseClock
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout

MODES = {
    "full": BlendConfig(mode="full"),
    "reuse": BlendConfig(mode="reuse"),
    "cacheblend@15%": BlendConfig(selector="cacheblend", ratio=0.15),
    "profile@15%": BlendConfig(selector="profile", ratio=0.15),
    "epic@15%": BlendConfig(selector="epic", ratio=0.15),
    "preview@15%": BlendConfig(selector="preview", ratio=0.15),
}


def breakdown(engine, layout, names: list[str], repeats: int, tag: str = "") -> None:
    print(f"{'':18}" + "".join(f"{p[:9]:>10}" for p in PHASES) + f"{'sum':>9}{'TTFT':>9}")
    for name in names:
        config = MODES[name]
        engine.prefill(layout, config)
        ttft = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine.prefill(layout, config)
            ttft.append(time.perf_counter() - t0)
        phases = timed(engine, layout, config)
        print(f"{tag + name:18}" + "".join(f"{phases.get(p, 0) * 1e3:10.1f}" for p in PHASES)
              + f"{sum(phases.values()) * 1e3:9.0f}{statistics.median(ttft) * 1e3:9.0f}",
              flush=True)


def timed(engine, layout, config) -> dict[str, float]:
    """Seconds per phase of one prefill (engine/compute/observers.py)."""
    clock = PhaseClock(engine.device)
    engine.prefill(layout, config, observers=[clock])
    return clock.seconds


def blocks(engine, layout, repeats: int) -> None:
    default = attention.ROW_BLOCK
    try:
        for name in ("profile@15%", "reuse"):
            seen: dict[int, list[float]] = {}
            for _ in range(repeats):
                for size in (16, 32, 64, 128):
                    attention.ROW_BLOCK = size
                    phases = timed(engine, layout, MODES[name])
                    seen.setdefault(size, []).append(phases["attention"])
            print(name, "attention ms, min over calls: " + ", ".join(
                f"blocks of {size}: {min(v) * 1e3:.0f}" for size, v in seen.items()))
    finally:
        attention.ROW_BLOCK = default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--repeats", type=int, default=5, help="calls per figure (default: 5)")
    parser.add_argument("--ab", choices=("buffers", "blocks"), default=None,
                        help="an A/B check instead of the plain breakdown")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                        help="modes of the breakdown (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workload = TTFTWorkload()
    engine = build_engine(workload)
    layout = random_layout(workload, engine.model.config.vocab_size)
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=True)
    if args.ab == "blocks":
        blocks(engine, layout, args.repeats)
        return
    breakdown(engine, layout, args.modes, args.repeats, "pooled " if args.ab else "")
    if args.ab == "buffers":
        runner = engine.runner
        pooled = runner.buffer

        def fresh(capacity: int):
            runner.release_buffers()  # nothing pooled: every request allocates
            return pooled(capacity)

        runner.buffer = fresh
        breakdown(engine, layout, args.modes, args.repeats, "fresh ")


if __name__ == "__main__":
    main()
