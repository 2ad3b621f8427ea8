#!/usr/bin/env python
"""Ablation on the demo model: which tokens must blend recompute for cross-chunk questions?

Exact-match accuracy on the held-out `pronoun` questions (the referent is named in another
passage) for full, reuse and blend variants at 15 % of the chunk tokens, with the mean
recompute fraction over layers (the compute actually spent). Usage:
``python scripts/ablate_selectors.py [--questions N]``.
"""

from __future__ import annotations

import argparse

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.demo import HELDOUT_SEED, PREFIX, demo_model_path, exact_match, format_chunk, format_suffix, generate_examples

VARIANTS = {
    "full": BlendConfig(mode="full"),
    "reuse": BlendConfig(mode="reuse"),
    "cacheblend, V deviation, check L1": BlendConfig(ratio=0.15),
    "cacheblend, K deviation, check L1": BlendConfig(ratio=0.15, deviation="key"),
    "cacheblend, check L2": BlendConfig(ratio=0.15, check_layers=(2,)),
    "cacheblend, gradual L1,L2 (30>15%)": BlendConfig(ratio=0.15, check_layers=(1, 2)),
    "cacheblend, gradual L1-L3 (60>30>15%)": BlendConfig(ratio=0.15, check_layers=(1, 2, 3), ratio_schedule=(0.6, 0.3, 0.15)),
    "epic": BlendConfig(ratio=0.15, selector="epic"),
    "query, check L1": BlendConfig(ratio=0.15, selector="query"),
    "query, check L2": BlendConfig(ratio=0.15, selector="query", check_layers=(2,)),
    "query, check L3 (last)": BlendConfig(ratio=0.15, selector="query", check_layers=(3,)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=60)
    args = parser.parse_args()
    engine = BlendEngine.from_pretrained(demo_model_path(), chat=False)
    examples = [x for x in generate_examples(300, HELDOUT_SEED) if x.kind == "pronoun"][: args.questions]
    layouts = [engine.build_prompt(PREFIX, [format_chunk(c) for c in x.chunks], format_suffix(x.question))
               for x in examples]
    gen = GenerationConfig(max_new_tokens=6)
    print(f"{len(examples)} held-out pronoun questions, blend at 15 % of chunk tokens")
    print(f"{'variant':40s} {'accuracy':>9s} {'recompute':>10s}")
    for name, cfg in VARIANTS.items():
        results = [engine.generate(lay, cfg, gen) for lay in layouts]
        acc = sum(exact_match(r.text, x.answers) for r, x in zip(results, examples)) / len(examples)
        recompute = sum(r.stats.recompute_fraction for r in results) / len(results)
        print(f"{name:40s} {acc:9.3f} {recompute:10.3f}")


if __name__ == "__main__":
    main()
