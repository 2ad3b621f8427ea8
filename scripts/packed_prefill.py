"""What N requests' prefills cost with their main passes packed into one forward
(engine/request/packing.py, engine/compute/packed.py) against one after another, on the
default model and ``bench serve``'s prompts: per mode, the time until all N are prefilled,
and each main pass's share of it.

    .venv/bin/python scripts/packed_prefill.py
"""

from __future__ import annotations

import statistics
import time

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.engine.compute.threads import torch_threads
from blendrag.engine.request.packing import run_together
from blendrag.serving.config import DEFAULT_PACK_TOKENS
from blendrag_bench.serve import ServeBenchConfig, prompts

REPEATS = 5
MODES = {"reuse": BlendConfig(mode="reuse"), "default": BlendConfig(),
         "full": BlendConfig(mode="full")}
GEN = GenerationConfig(max_new_tokens=1)


def costs(engine: BlendEngine, counts: tuple[int, ...] = (1, 2, 4, 8)) -> None:
    layouts = prompts(engine, ServeBenchConfig(requests=max(counts)))
    print(f"{len(layouts)} prompts of {layouts[0].num_tokens}-{max(x.num_tokens for x in layouts)}"
          " tokens; milliseconds until all N are prefilled (medians of "
          f"{REPEATS}), one after another | packed")
    for name, blend in MODES.items():
        for layout in layouts:  # warm: the first request's one-off costs
            engine.prefill(layout, blend, 1)
        for n in counts:
            chosen = layouts[:n]
            apart = _median(lambda c=chosen, b=blend: [engine.stream(x, b, GEN) for x in c])
            packed = _median(lambda c=chosen, b=blend: _packed(engine, c, b))
            print(f"{name:<8} {n} | {apart:7.1f} | {packed:7.1f}  ({apart / packed:.2f}x)")


def _packed(engine: BlendEngine, layouts, blend: BlendConfig) -> None:
    steps = [engine.stream_steps(x, blend, GEN) for x in layouts]
    with torch_threads(engine.threads):  # as ``stream`` runs each alone
        for out in run_together(engine.runner, steps, DEFAULT_PACK_TOKENS):
            if isinstance(out, BaseException):
                raise out


def _median(run) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


if __name__ == "__main__":
    costs(BlendEngine.from_pretrained())
