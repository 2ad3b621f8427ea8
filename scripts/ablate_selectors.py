#!/usr/bin/env python
"""Ablation on the demo model: which tokens must blend recompute for cross-chunk questions?

Exact-match accuracy on held-out questions (default: the ``pronoun`` kind, whose referent is
named in another passage) for full, reuse and blend variants at 15 % of the chunk tokens,
with the mean recompute fraction over layers (the compute actually spent). Besides the
package's selectors it runs *oracles*, which rank tokens by their true deviation between a
reuse and a full prefill of the very prompt, stored as the chunks' profiles for the
``profile`` selector (so they cost a full prefill and are not usable at serving time); they
show which signal identifies the tokens worth recomputing. Usage:
``python scripts/ablate_selectors.py [--kind pronoun|all|...] [--questions N] [--ratio R]``.
"""

from __future__ import annotations

import argparse
import random

import torch

from blendrag import BlendConfig, BlendEngine, CacheBlendOptions, GenerationConfig, QueryOptions
from blendrag.prompt import PromptLayout
from blendrag.store.ram import MemoryKVStore
from blendrag_demo import (
    HELDOUT_SEED,
    PREFIX,
    demo_model_path,
    exact_match,
    format_chunk,
    format_suffix,
    generate_examples,
)


def cacheblend(r: float, **options) -> BlendConfig:
    return BlendConfig(selector="cacheblend", ratio=r, options=CacheBlendOptions(**options))


def variants(r: float) -> dict[str, BlendConfig]:
    return {
        "full": BlendConfig(mode="full"),
        "reuse": BlendConfig(mode="reuse"),
        "cacheblend, V deviation, check L1": cacheblend(r),
        "cacheblend, K deviation, check L1": cacheblend(r, deviation="key"),
        "cacheblend, check L2": cacheblend(r, check_layers=(2,)),
        "cacheblend, gradual L1-L3": cacheblend(
            r, check_layers=(1, 2, 3), ratio_schedule=(min(1.0, 4 * r), min(1.0, 2 * r), r)),
        "epic": BlendConfig(ratio=r, selector="epic"),
        "query, check L1": BlendConfig(ratio=r, selector="query"),
        "query, check L3 (last)": BlendConfig(ratio=r, selector="query",
                                              options=QueryOptions(check_layers=(3,))),
        "random": BlendConfig(ratio=r, selector="random"),
    }


ORACLES = {  # name -> per-token score from the true deviation, d[kind]: [layers, C]
    "oracle: K deviation, sum over layers": lambda d: d["k"].sum(0),
    "oracle: V deviation, sum over layers": lambda d: d["v"].sum(0),
    "oracle: V deviation at layer 1": lambda d: d["v"][1],
}


def true_deviation(engine: BlendEngine, layout: PromptLayout) -> dict[str, torch.Tensor]:
    """Squared K and V distance between full and reuse prefill per layer and chunk token."""
    n, start, end = layout.num_tokens, len(layout.prefix_ids), layout.suffix_start
    full = engine.prefill(layout, BlendConfig(mode="full")).fused
    reuse = engine.prefill(layout, BlendConfig(mode="reuse")).fused
    return {
        kind: (getattr(full, kind)[:, :, :n] - getattr(reuse, kind)[:, :, :n])
        .float()
        .pow(2)
        .sum(dim=(1, 3))[:, start:end]
        for kind in ("k", "v")
    }


def store_oracle(engine: BlendEngine, layout: PromptLayout, score: torch.Tensor) -> None:
    """Store ``score`` ([C], one value per chunk token) as the chunks' profiles, so that the
    ``profile`` selector ranks by it: an oracle is a profile measured on the very prompt."""
    start = len(layout.prefix_ids)
    for (s, e), ids in zip(layout.chunk_spans, layout.chunk_ids):
        key = engine.key(layout.chunk_prefix_ids, ids)
        engine.store.put(key, engine.store.get(key).with_profile(score[s - start : e - start]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="pronoun", help="question kind, or 'all'")
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--ratio", type=float, default=0.15)
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = BlendEngine.from_pretrained(demo_model_path(), chat=False)
    pool = [x for x in generate_examples(1000, HELDOUT_SEED) if args.kind in ("all", x.kind)]
    examples = pool[: args.questions]
    layouts = [engine.build_prompt(PREFIX, [format_chunk(c) for c in x.chunks],
                                   format_suffix(x.question))
               for x in examples]
    gen = GenerationConfig(max_new_tokens=6)
    print(f"{len(examples)} held-out questions ({args.kind}), blend at {args.ratio:.0%} of chunk "
          "tokens")
    print(f"{'variant':56s} {'accuracy':>9s} {'recompute':>10s}")

    def report(name: str, results: list) -> None:
        acc = sum(exact_match(r.text, x.answers) for r, x in zip(results, examples)) / len(examples)
        recompute = sum(r.stats.recompute_fraction for r in results) / len(results)
        print(f"{name:56s} {acc:9.3f} {recompute:10.3f}", flush=True)

    for name, cfg in variants(args.ratio).items():
        report(name, [engine.generate(lay, cfg, gen) for lay in layouts])
    profile = BlendConfig(ratio=args.ratio, selector="profile")
    for k in (1, 3):
        for order in ("prompt", "shuffled"):
            engine.store = MemoryKVStore()  # fresh profiles, measured in this order at ingestion
            rng = random.Random(0)
            for lay in layouts:
                chunks = list(lay.chunk_ids)
                if order == "shuffled":
                    rng.shuffle(chunks)
                engine.precompute(lay.chunk_prefix_ids, chunks, profile=k)
            after = "" if k == 1 else f", after {k} neighbours"
            report(f"profile, ingested in {order} order{after}",
                   [engine.generate(lay, profile, gen) for lay in layouts])
    for name, rank in ORACLES.items():
        results = []
        for lay in layouts:
            store_oracle(engine, lay, rank(true_deviation(engine, lay)))
            results.append(engine.generate(lay, profile, gen))
        report(name, results)

if __name__ == "__main__":
    main()
