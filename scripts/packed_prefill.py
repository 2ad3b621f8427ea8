"""What N requests' prefills cost with their passes packed into one forward
(engine/request/packing.py, engine/compute/packed.py) against one after another, on the
default model and ``bench serve``'s prompts: per mode, the time until all N are prefilled.
Then a burst: 4 requests submitted to the scheduler at once (its prefill worker on), the time
to each one's first token, with the decoding loop idle while the worker prefills them
(``Scheduler._prefill_idle`` patched off, as before it existed) and with it prefilling beside
the worker (the default), alternated.

    .venv/bin/python scripts/packed_prefill.py [--burst]
"""

from __future__ import annotations

import statistics

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.engine.compute.threads import torch_threads
from blendrag.engine.request.packing import run_together
from blendrag.serving import Scheduler, ServingConfig
from blendrag.serving.config import DEFAULT_PACK_TOKENS
from blendrag_bench.serve import ServeBenchConfig, prompts
from blendrag_bench.timing import median_time

REPEATS = 5
MODES = {"reuse": BlendConfig(mode="reuse"), "default": BlendConfig(),
         "full": BlendConfig(mode="full")}
GEN = GenerationConfig(max_new_tokens=1)


def _ms(run) -> float:
    """The median milliseconds of ``REPEATS`` calls of ``run``."""
    return median_time(run, REPEATS).seconds * 1e3


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
            apart = _ms(lambda c=chosen, b=blend: [engine.stream(x, b, GEN) for x in c])
            packed = _ms(lambda c=chosen, b=blend: _packed(engine, c, b))
            print(f"{name:<8} {n} | {apart:7.1f} | {packed:7.1f}  ({apart / packed:.2f}x)")


def _packed(engine: BlendEngine, layouts, blend: BlendConfig) -> None:
    steps = [engine.stream_steps(x, blend, GEN) for x in layouts]
    with torch_threads(engine.threads):  # as ``stream`` runs each alone
        for out in run_together(engine.runner, steps, DEFAULT_PACK_TOKENS):
            if isinstance(out, BaseException):
                raise out


def burst(engine: BlendEngine, users: int = 4) -> None:
    layouts = prompts(engine, ServeBenchConfig(requests=users))
    blend, gen = BlendConfig(), GenerationConfig(max_new_tokens=8)
    firsts: dict[str, list[float]] = {"worker alone": [], "worker + idle loop": []}
    for _ in range(REPEATS):
        for arm, times in firsts.items():
            scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=1, pack_tokens=0))
            if arm == "worker alone":
                scheduler._prefill_idle = lambda: False  # type: ignore[method-assign]
            with scheduler._cond:  # all admitted in one turn
                handles = [scheduler.submit(engine, x, blend, gen) for x in layouts]
            ttfts = sorted(h.wait(120).stats.timing.ttft_s for h in handles)
            times.append(ttfts[-1] * 1e3)
            scheduler.close()
    print(f"a burst of {users} requests, the default blend, through the scheduler: the last "
          f"first token, ms (median of {REPEATS})")
    for arm, times in firsts.items():
        print(f"{arm:<20} {statistics.median(times):7.1f}")
    alone, both = (statistics.median(t) for t in firsts.values())
    print(f"ratio {alone / both:.2f}x")


if __name__ == "__main__":
    import sys

    engine = BlendEngine.from_pretrained()
    if "--burst" not in sys.argv:  # --burst: the burst alone
        costs(engine)
    burst(engine)
