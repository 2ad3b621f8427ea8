"""How far could choosing the ratio per request go, in whole-answer terms? An oracle bound.

    python scripts/answer_bounds.py --limit 40 --offset 0

Escalation (more recompute, or full prefill, for the requests at risk) is one way to keep full
prefill's answers. Before building a policy, this bounds what any policy over these options can
reach: per synthetic item it measures every option (full KV reuse, the default selector at each
of ``--ratios``, full prefill) in whole-answer terms (same answer as full, answer KL, compute
fraction: every computed token-layer, preview pass included, over full prefill's), then:

- the cheapest option per item that gives full prefill's answer, **knowing the answer** (which
  no real policy knows): the mean compute at which every answer is full's;
- starting from the default for every request, the cheapest upgrades (again knowing each
  request's outcome) that bring the same-answer share to ``--same``: its mean compute.

A real policy decides from a signal before it knows the answer, so it needs at least this much
compute; if the bound is above the budget, no escalation policy meets the target within it.
"""

from __future__ import annotations

import argparse
import math

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.eval.answer import compare_answers
from blendrag_bench.datasets import load_synthetic

RATIOS = (0.1, 0.2, 0.3, 0.5, 0.7)
NEW_TOKENS = 16


def measure(engine: BlendEngine, items, ratios) -> list[dict[str, tuple[float, bool, float]]]:
    """Per item: option -> (compute fraction, same answer as full, answer KL)."""
    options = [BlendConfig(mode="full"), BlendConfig(mode="reuse")]
    options += [BlendConfig(ratio=r) for r in ratios]
    rows = []
    for i, item in enumerate(items):
        layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
        engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))
        compared = compare_answers(engine, layout, options, NEW_TOKENS)
        rows.append({c.config.label: (c.stats.compute_fraction, c.same_answer, c.answer_kl)
                     for c in compared})
        print(f"item {i + 1}/{len(items)}", flush=True)
    return rows


def upgrades_to(rows, start: str, share: float) -> tuple[float, float, float]:
    """From ``start`` for every item, the cheapest per-item upgrades to an option with full's
    answer until ``share`` of the items have it: (mean compute, same share, mean answer KL)."""
    picks = [r[start] for r in rows]
    costs = []
    for i, r in enumerate(rows):
        if not picks[i][1]:
            fix = min((o for o in r.values() if o[1]), key=lambda o: o[0])  # full always is
            costs.append((fix[0] - picks[i][0], i, fix))
    needed = max(0, math.ceil(share * len(rows) - 1e-9) - sum(p[1] for p in picks))
    for _, i, fix in sorted(costs)[:needed]:
        picks[i] = fix
    n = len(rows)
    return (sum(p[0] for p in picks) / n, sum(p[1] for p in picks) / n,
            sum(p[2] for p in picks) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=40, help="items (default: 40)")
    parser.add_argument("--offset", type=int, default=0, help="first item (default: 0)")
    parser.add_argument("--same", type=float, default=0.9,
                        help="same-answer share the upgrades aim at (default: 0.9)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct")
    rows = measure(engine, load_synthetic(limit=args.limit, offset=args.offset), RATIOS)
    n = len(rows)
    print(f"\nsynthetic items {args.offset}..{args.offset + n - 1}, SmolLM2-135M-Instruct, "
          f"answers of {NEW_TOKENS} tokens at most\n")
    print("| option, every request | compute | same answer as full | answer KL |")
    print("|---|---:|---:|---:|")
    for name in rows[0]:
        compute, same, kl = (sum(r[name][j] for r in rows) / n for j in range(3))
        print(f"| {name} | {compute:.3f} | {same:.3f} | {kl:.4f} |")
    cheapest = [min((o for o in r.values() if o[1]), key=lambda o: o[0]) for r in rows]
    print(f"\noracle, every answer full's: mean compute {sum(c[0] for c in cheapest) / n:.3f}, "
          f"answer KL {sum(c[2] for c in cheapest) / n:.4f}")
    default = BlendConfig().label
    compute, same, kl = upgrades_to(rows, default, args.same)
    print(f"oracle upgrades from {default} to {args.same:.0%} same answer: mean compute "
          f"{compute:.3f} (same {same:.3f}, answer KL {kl:.4f})")


if __name__ == "__main__":
    main()
