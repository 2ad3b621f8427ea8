"""Ablation of the default selector's ingredients on the real model: the ingestion context
(chunks stored computed after filler contexts, with their context shift; the first passage's
exact rows) and the preview pass (the question's attention over the cached rows).

    python scripts/fidelity_ablation.py --limit 40 --offset 500

For each item of the synthetic set: full prefill (the reference), then reuse and blend at
``--ratio`` with chunks stored alone (``NO_CONTEXT``), after two one-passage fillers (the
earlier default), after three two-passage fillers (the default fillers), and with the first
passage's exact rows on top (the default context); ``preview`` with the attention floor at its
default (attention x shift), at 1e6 (shift only: the preview barely matters) and, with chunks
stored alone, attention only (no shift stored). Prints mean first-token agreement and
KL(full || mode) per row: the figures quoted in docs/architecture.md, "The default".
"""

from __future__ import annotations

import argparse

import torch

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine, ChunkContext, PreviewOptions
from blendrag.engine.caches.context import PASSAGES
from blendrag.eval.metrics import first_token_agrees, first_token_kl
from blendrag_bench.datasets import load_synthetic


def rows(ratio: float) -> list[tuple[str, ChunkContext, BlendConfig]]:
    one = ChunkContext(fillers=PASSAGES[:2], exact_first=False)  # the earlier default
    two = ChunkContext(exact_first=False)
    default = ChunkContext()
    reuse = BlendConfig(mode="reuse")
    preview = BlendConfig(selector="preview", ratio=ratio)
    cacheblend = BlendConfig(selector="cacheblend", ratio=ratio)
    return [
        ("reuse, chunks alone", NO_CONTEXT, reuse),
        ("reuse, 2 fillers of 1 passage", one, reuse),
        ("reuse, 3 fillers of 2 passages", two, reuse),
        ("reuse, 3 fillers of 2 + exact first (default)", default, reuse),
        (f"cacheblend@{ratio}, chunks alone", NO_CONTEXT, cacheblend),
        (f"cacheblend@{ratio}, 2 fillers of 1 passage", one, cacheblend),
        (f"cacheblend@{ratio}, default context", default, cacheblend),
        (f"preview@{ratio}, attention only (chunks alone)", NO_CONTEXT, preview),
        (f"preview@{ratio}, shift only, default context", default,
         BlendConfig(selector="preview", ratio=ratio,
                     options=PreviewOptions(attention_floor=1e6))),
        (f"preview@{ratio}, 2 fillers of 1 passage", one, preview),
        (f"preview@{ratio}, 3 fillers of 2 passages", two, preview),
        (f"preview@{ratio}, 3 fillers of 2 + exact first (default)", default, preview),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=40, help="items (default: 40)")
    parser.add_argument("--offset", type=int, default=0, help="first item (default: 0)")
    parser.add_argument("--ratio", type=float, default=0.2, help="blend ratio (default: 0.2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = BlendEngine.from_pretrained("smollm2-135m-instruct")
    table = rows(args.ratio)
    engines = {ctx: BlendEngine(base.model, base.tokenizer, context=ctx)
               for ctx in dict.fromkeys(ctx for _, ctx, _ in table)}
    agree = {name: [] for name, _, _ in table}
    kl = {name: [] for name, _, _ in table}
    items = load_synthetic(limit=args.limit, offset=args.offset)
    for i, item in enumerate(items):
        layout = base.build_prompt(item.prefix, item.chunks, item.suffix)
        ref = base.prefill(layout, BlendConfig(mode="full")).logits
        for name, ctx, cfg in table:
            logits = engines[ctx].prefill(layout, cfg).logits
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
