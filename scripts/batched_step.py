"""What one batched decoding step costs for N requests against one request's step, on the
default model (engine/compute/batch_decode.py), and whether two compute threads run side by
side on this machine (a prefill worker's premise: serving/config.py).

    .venv/bin/python scripts/batched_step.py
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag_bench.serve import ServeBenchConfig, prompts

REPEATS = 12


def step_costs(engine: BlendEngine, counts: tuple[int, ...] = (1, 2, 4, 8)) -> None:
    layouts = prompts(engine, ServeBenchConfig(requests=max(counts)))
    pres = [engine.prefill(lay, BlendConfig(mode="full"), extra_capacity=REPEATS * len(counts))
            for lay in layouts]
    tokens = [int(p.logits.argmax()) for p in pres]
    single = 0.0
    for n in counts:
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            if n == 1:
                engine.runner.decode(tokens[0], pres[0].fused)
            else:
                engine.runner.decode_many(tokens[:n], [p.fused for p in pres[:n]])
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        single = single or ms
        print(f"{n} requests: step {ms:6.1f} ms, {ms / n:5.1f} ms per token "
              f"({single * n / ms:.2f}x the tokens/s of one)")


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
