"""Does selecting for the answer, rather than the question, keep full prefill's answer?

    python scripts/answer_selection_ablation.py --offset 200 --limit 20 --ratio 0.2

The preview selector ranks chunk tokens by the attention the suffix (question + answer cue)
pays them over the cached rows. Hypothesis: later answer tokens read other passage tokens,
which stay stale. Per synthetic item this runs, at one ratio, the preview selector three ways:

- ``preview``: as shipped (the suffix's attention);
- ``draft``: the preview pass runs over the suffix followed by full KV reuse's own greedy answer
  (a draft any request can afford: it is decoded from the cached rows alone);
- ``oracle``: the preview pass runs over the suffix followed by *full prefill's* answer (which
  no real request knows): the best any answer-aware ranking of this kind can do.

and prints, per variant, the share of items whose whole greedy answer (16 tokens) is full
prefill's, the answer KL (teacher-forced on full's answer) and first-token agreement. The
variants replace the engine's preview pass for the run (``blendrag.engine.request``'s
``suffix_attention``) by the same pass over a longer suffix; nothing else changes.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.engine import request
from blendrag.engine.preview import suffix_attention
from blendrag.eval.answer import answer_kl, forced_logits, greedy_answer, same_answer
from blendrag.model.rope import RopeTable
from blendrag_bench.datasets import load_synthetic

NEW_TOKENS = 16
_extra: dict[str, tuple[int, ...]] = {"ids": ()}  # answer tokens the preview pass also runs


def _preview_with_answer(adapter, layout, cached, fused, rope, feed=None):
    """The preview pass over the suffix followed by ``_extra["ids"]`` (rows past the prompt are
    overwritten by decoding later; the buffer has room for them)."""
    if not _extra["ids"]:
        return suffix_attention(adapter, layout, cached, fused, rope, feed)
    longer = dataclasses.replace(layout, suffix_ids=layout.suffix_ids + _extra["ids"])
    rope = RopeTable(adapter.rotary, longer.num_tokens, fused.k.dtype, fused.k.device)
    return suffix_attention(adapter, longer, cached, fused, rope, feed)


def _run(engine: BlendEngine, layout, config: BlendConfig, extra: tuple[int, ...] = ()):
    """(prefill, greedy answer) of ``config``; ``extra``: answer tokens the preview pass runs."""
    _extra["ids"] = tuple(t for t in extra if t not in engine.eos_token_ids)
    pre = engine.prefill(layout, config, extra_capacity=NEW_TOKENS + len(_extra["ids"]))
    return pre, greedy_answer(engine, pre, NEW_TOKENS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--offset", type=int, default=200)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--ratio", type=float, default=0.2)
    args = p.parse_args()
    torch.set_num_threads(1)
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct")
    request.suffix_attention = _preview_with_answer
    blend = BlendConfig(ratio=args.ratio)
    rows: dict[str, list[tuple[bool, float, bool]]] = {"reuse": [], "preview": [], "draft": [],
                                                       "oracle": []}
    for item in load_synthetic(limit=args.limit, offset=args.offset):
        layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
        engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))

        _, full = _run(engine, layout, BlendConfig(mode="full"))
        variants = {"reuse": (BlendConfig(mode="reuse"), ()), "preview": (blend, ())}
        pre, reuse = _run(engine, layout, *variants["reuse"])
        variants |= {"draft": (blend, reuse.token_ids), "oracle": (blend, full.token_ids)}
        for name, (config, extra) in variants.items():
            pre, own = _run(engine, layout, config, extra)
            kl = answer_kl(full.logits, forced_logits(engine, pre, own, full.token_ids))
            rows[name].append((same_answer(own.text, full.text), kl,
                               own.token_ids[0] == full.token_ids[0]))
    n = len(rows["reuse"])
    print(f"{n} synthetic items from {args.offset}, ratio {args.ratio:g}, answers of "
          f"{NEW_TOKENS} tokens at most")
    print(f"{'variant':<10}{'same answer':>12}{'answer KL':>11}{'first token':>13}")
    for name, got in rows.items():
        print(f"{name:<10}{sum(r[0] for r in got) / n:>12.3f}{sum(r[1] for r in got) / n:>11.4f}"
              f"{sum(r[2] for r in got) / n:>13.3f}")


if __name__ == "__main__":
    main()
