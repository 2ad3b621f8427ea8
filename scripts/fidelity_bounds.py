"""How far could a per-request ratio go? An upper bound on the real model.

    python scripts/fidelity_bounds.py --limit 40 --offset 0 --budget 0.2

For each synthetic item: full prefill (the reference), reuse, and the default selector at each
of ``--ratios``; per item and option, the recompute fraction and KL(full || option). Prints the
frontier (the default selector at one ratio for every request), then an **oracle allocation**:
each request gets the option that minimizes KL + lambda * recompute, knowing its true KL (which
no real policy knows), for a sweep of lambda; the rows whose mean recompute is at most
``--budget`` bound what any per-request ratio policy over these options can reach at that
budget. Full prefill (recompute 1.0, KL 0) is one of the options.
"""

from __future__ import annotations

import argparse

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.eval.metrics import first_token_agrees, first_token_kl
from blendrag_bench.datasets import load_synthetic

RATIOS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7)
LAMBDAS = (0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5)


def measure(engine: BlendEngine, items, ratios) -> list[dict[str, tuple[float, float, bool]]]:
    """Per item: option -> (recompute fraction, KL(full || option), first token agrees)."""
    options = {"reuse": BlendConfig(mode="reuse")}
    options |= {f"preview@{r:g}": BlendConfig(ratio=r) for r in ratios}
    rows = []
    for i, item in enumerate(items):
        layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
        ref = engine.prefill(layout, BlendConfig(mode="full")).logits
        row = {"full": (1.0, 0.0, True)}
        for name, cfg in options.items():
            pre = engine.prefill(layout, cfg)
            row[name] = (pre.stats.recompute_fraction, first_token_kl(ref, pre.logits),
                         first_token_agrees(ref, pre.logits))
        rows.append(row)
        print(f"item {i + 1}/{len(items)}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=40, help="items (default: 40)")
    parser.add_argument("--offset", type=int, default=0, help="first item (default: 0)")
    parser.add_argument("--budget", type=float, default=0.2,
                        help="mean recompute fraction of the bound (default: 0.2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct")
    rows = measure(engine, load_synthetic(limit=args.limit, offset=args.offset), RATIOS)
    n = len(rows)
    print(f"\nsynthetic items {args.offset}..{args.offset + n - 1}, SmolLM2-135M-Instruct\n")
    print("| option, every request | recompute | first-token agreement | KL(full‖mode) |")
    print("|---|---:|---:|---:|")
    for name in rows[0]:
        rf, kl, ok = (sum(r[name][j] for r in rows) / n for j in range(3))
        print(f"| {name} | {rf:.3f} | {ok:.3f} | {kl:.4f} |")
    print("\n| oracle allocation, lambda | mean recompute | first-token agreement | KL(full‖mode) "
          "| requests given full |\n|---:|---:|---:|---:|---:|")
    for lam in LAMBDAS:
        picks = [min(r.values(), key=lambda o: o[1] + lam * o[0]) for r in rows]
        rf, kl, ok = (sum(p[j] for p in picks) / n for j in range(3))
        mark = " (within budget)" if rf <= args.budget else ""
        full = sum(p[0] == 1.0 for p in picks)
        print(f"| {lam:g}{mark} | {rf:.3f} | {ok:.3f} | {kl:.4f} | {full} |")


if __name__ == "__main__":
    main()
