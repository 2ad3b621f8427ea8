"""FLOP rates of the kernels a cached request runs, against those of full prefill.

    python scripts/kernel_rates.py --threads 1

On ``bench ttft``'s default model shape (hidden 512, MLP 1792, 8 query / 2 KV heads of 64,
3,168-token prompt): the MLP's matmuls at the row counts of reuse (64 suffix tokens), of blend
at 15 % (525 rows) and of full prefill (3,168), and attention of reuse's 64 suffix queries and
of blend's scattered queries (position-sorted blocks of 64, as ``plan_attention`` cuts them)
against full prefill's causal attention. A share below 1 is time a mode loses to its compute
ideal because its kernels run slower per FLOP than full prefill's; the figures are quoted in
docs/architecture.md, "The fixed cost of a cached request". Minimum of ``--repeats`` calls.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from blendrag.engine.compute.attention import BlockPlan, plan_attention
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer import attend
from blendrag_bench.ttft import TTFTWorkload

W = TTFTWorkload()  # bench ttft's default shape
T = W.prefix_tokens + W.chunks * W.chunk_tokens + W.suffix_tokens  # 3,168
CHUNK = W.chunks * W.chunk_tokens
HIDDEN, MLP, HEADS, KV_HEADS = W.hidden, W.intermediate, W.heads, W.kv_heads
D = HIDDEN // HEADS  # head_dim, as MistralConfig derives it
SELECTED = math.ceil(0.15 * CHUNK)  # blend at 15 %: 461 chunk tokens, + the suffix


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def mlp_rates(repeats: int) -> None:
    gate, up = torch.nn.Linear(HIDDEN, MLP, bias=False), torch.nn.Linear(HIDDEN, MLP, bias=False)
    down = torch.nn.Linear(MLP, HIDDEN, bias=False)
    print("MLP (gate, up, down)   rows      ms  GFLOP/s  rate vs full's")
    rates = {}
    for name, rows in (("full", T), ("blend@15%", SELECTED + W.suffix_tokens),
                       ("reuse", W.suffix_tokens)):
        x = torch.randn(rows, HIDDEN)
        ms = best_ms(lambda x=x: down(F.silu(gate(x)) * up(x)), repeats)
        rates[name] = rows * HIDDEN * MLP * 3 * 2 / ms / 1e6
        share = rates[name] / rates["full"]
        print(f"  {name:20} {rows:6} {ms:7.2f} {rates[name]:8.1f} {share:10.2f}")


def attention_rates(repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    kv = FusedKV.over(torch.randn(1, KV_HEADS, T, D, generator=g),
                      torch.randn(1, KV_HEADS, T, D, generator=g))  # one layer of a request KV
    adapter = SimpleNamespace(scaling=D ** -0.5)  # all ``attend`` reads of an adapter
    chunk = torch.randperm(CHUNK, generator=g)[:SELECTED].sort().values + W.prefix_tokens
    suffix = torch.arange(T - W.suffix_tokens, T)
    print("attention              queries  ms     pairs/s (M)  rate vs full's  computed/visible")
    rates = {}
    for name, pos in (("full", torch.arange(T)), ("blend@15%", torch.cat([chunk, suffix])),
                      ("reuse", suffix)):
        q = torch.randn(HEADS, pos.shape[0], D, generator=g)
        plan = plan_attention(pos, T, None)  # what the engine's loop would run on the CPU
        ms = best_ms(lambda q=q, p=plan: attend(adapter, 0, q, kv, p), repeats)
        visible = int((pos + 1).sum())  # the query-key pairs the causal mask lets through
        # a masked block computes every pair of its rectangle; the causal kernel skips the rest
        computed = visible if not isinstance(plan, BlockPlan) else sum(
            (rows.stop - rows.start) * (keys.stop - keys.start) for rows, keys, _ in plan.blocks)
        rates[name] = HEADS * visible / ms / 1e3
        print(f"  {name:20} {pos.shape[0]:6} {ms:7.2f} {rates[name]:12.1f} "
              f"{rates[name] / rates['full']:10.2f} {computed / visible:13.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--repeats", type=int, default=10, help="calls per figure (default: 10)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    with torch.inference_mode():
        mlp_rates(args.repeats)
        attention_rates(args.repeats)


if __name__ == "__main__":
    main()
