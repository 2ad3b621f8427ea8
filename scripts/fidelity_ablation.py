"""Ablation of the default selector's two ingredients on the real model: the ingestion context
(chunks stored computed after filler passages, with their context shift) and the preview pass
(the question's attention over the cached rows).

    python scripts/fidelity_ablation.py --limit 12 --offset 0

For each item of the synthetic set: full prefill (the reference), then reuse and blend at
``--ratio`` with chunks stored alone (``NO_CONTEXT``) and in the default ingestion context;
``preview`` with the attention floor at its default (attention x shift), at 1e6 (shift only:
the preview barely matters) and, with chunks stored alone, attention only (no shift stored).
Prints mean first-token agreement and KL(full || mode) per row: the figures quoted in
docs/architecture.md, "Fidelity on a real model".
"""

from __future__ import annotations

import argparse

import torch

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine, ChunkContext
from blendrag.eval.metrics import first_token_agrees, first_token_kl
from blendrag_bench.datasets import load_synthetic


def rows(ratio: float) -> list[tuple[str, ChunkContext, BlendConfig]]:
    fill = ChunkContext()
    return [
        ("reuse, chunks alone", NO_CONTEXT, BlendConfig(mode="reuse")),
        ("reuse, ingestion context", fill, BlendConfig(mode="reuse")),
        (f"cacheblend@{ratio}, chunks alone", NO_CONTEXT,
         BlendConfig(selector="cacheblend", ratio=ratio)),
        (f"cacheblend@{ratio}, ingestion context", fill,
         BlendConfig(selector="cacheblend", ratio=ratio)),
        (f"preview@{ratio}, attention only (chunks alone)", NO_CONTEXT,
         BlendConfig(selector="preview", ratio=ratio)),
        (f"preview@{ratio}, shift only", fill,
         BlendConfig(selector="preview", ratio=ratio, attention_floor=1e6)),
        (f"preview@{ratio}, attention x shift (default)", fill,
         BlendConfig(selector="preview", ratio=ratio)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=12, help="items (default: 12)")
    parser.add_argument("--offset", type=int, default=0, help="first item (default: 0)")
    parser.add_argument("--ratio", type=float, default=0.2, help="blend ratio (default: 0.2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = BlendEngine.from_pretrained("smollm2-135m-instruct")
    engines = {ctx.tag: BlendEngine(base.model, base.tokenizer, context=ctx)
               for ctx in (NO_CONTEXT, ChunkContext())}
    table = rows(args.ratio)
    agree = {name: [] for name, _, _ in table}
    kl = {name: [] for name, _, _ in table}
    items = load_synthetic(limit=args.limit, offset=args.offset)
    for i, item in enumerate(items):
        layout = base.build_prompt(item.prefix, item.chunks, item.suffix)
        ref = base.prefill(layout, BlendConfig(mode="full")).logits
        for name, ctx, cfg in table:
            logits = engines[ctx.tag].prefill(layout, cfg).logits
            agree[name].append(float(first_token_agrees(ref, logits)))
            kl[name].append(first_token_kl(ref, logits))
        print(f"item {i + 1}/{len(items)}", flush=True)
    print(f"\nsynthetic items {args.offset}..{args.offset + len(items) - 1}, "
          f"SmolLM2-135M-Instruct\n")
    print("| configuration | first-token agreement | KL(full‖mode) |\n|---|---:|---:|")
    for name, _, _ in table:
        n = len(agree[name])
        print(f"| {name} | {sum(agree[name]) / n:.3f} | {sum(kl[name]) / n:.4f} |")


if __name__ == "__main__":
    main()
