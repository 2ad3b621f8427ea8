"""What one batched decoding step costs for N requests against one request's step, on the
default model: over the requests' own buffers (engine/compute/batch_decode.py, attention per
request) and over the KV slab (engine/compute/slab_step.py, one attention call per layer);
and whether two compute threads run side by
side on this machine (a prefill worker's premise: serving/config.py).

    .venv/bin/python scripts/batched_step.py
"""

from __future__ import annotations

import threading
import time

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag_bench.serve import ServeBenchConfig, prompts
from blendrag_bench.timing import median_time

REPEATS = 12


def _ms(step) -> float:
    """The median milliseconds of ``REPEATS`` calls of ``step``."""
    return median_time(step, REPEATS).seconds * 1e3


def step_costs(engine: BlendEngine, counts: tuple[int, ...] = (1, 2, 4, 8)) -> None:
    layouts = prompts(engine, ServeBenchConfig(requests=max(counts)))
    extra = REPEATS * len(counts) * 2
    pres = [engine.prefill(lay, BlendConfig(mode="full"), extra_capacity=extra)
            for lay in layouts]
    slab = engine.runner.slab(max(counts), 1024)
    if slab is None:
        raise SystemExit("this model has no slab (dynamic RoPE)")
    in_slab = [engine.prefill(lay, BlendConfig(mode="full"), extra_capacity=extra)
               for lay in layouts]
    for pre in in_slab:  # as the scheduler does: prefilled, then moved into a slot
        pre.fused.move_to(slab.view(slab.claim() or 0, pre.fused.capacity))
    tokens = [int(p.logits.argmax()) for p in pres]
    single = 0.0
    print("requests | own buffers: step, per token, tokens/s vs one | slab: step, per token, "
          "tokens/s vs one")
    for n in counts:
        own = _ms(lambda n=n: engine.runner.decode(tokens[0], pres[0].fused) if n == 1
                      else engine.runner.decode_many(tokens[:n], [p.fused for p in pres[:n]]))
        slabbed = _ms(lambda n=n: engine.runner.decode_slab(
            slab,             tokens[:n], list(range(n)), [p.fused for p in in_slab[:n]]))
        single = single or own
        print(f"{n} | {own:6.1f} ms, {own / n:5.1f} ms, {single * n / own:.2f}x "
              f"| {slabbed:6.1f} ms, {slabbed / n:5.1f} ms, {single * n / slabbed:.2f}x")


def two_threads() -> None:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)

    def work() -> float:
        t0 = time.perf_counter()
        for _ in range(50):
            a @ b
        return time.perf_counter() - t0

    alone = work()
    took: list[float] = []
    threads = [threading.Thread(target=lambda: took.append(work())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"50 matmuls of 1024^2: {alone:.2f} s alone, {max(took):.2f} s each in two threads "
          f"({2 * alone / max(took):.2f}x the work per second)")


if __name__ == "__main__":
    torch.set_num_threads(1)
    step_costs(BlendEngine.from_pretrained(threads=None))
    two_threads()
