"""Does selecting for the answer, rather than the question, keep full prefill's answer? And
do rows stored after a chunk's real predecessor do better than the ingestion context's?

    python scripts/answer_selection_ablation.py --offset 200 --limit 20 --ratio 0.2

The preview selector ranks chunk tokens by the attention the suffix (question + answer cue)
pays them over the cached rows. Hypothesis: later answer tokens read other passage tokens,
which stay stale. Per synthetic item this runs, at one ratio, the preview selector three ways:

- ``preview``: as shipped (the suffix's attention);
- ``draft``: the preview pass runs over the suffix followed by full KV reuse's own greedy answer
  (a draft any request can afford: it is decoded from the cached rows alone);
- ``oracle``: the preview pass runs over the suffix followed by *full prefill's* answer (which
  no real request knows): the best any answer-aware ranking of this kind can do;
- ``true``: the ranking takes the attention that the suffix and full's answer pay each chunk
  token *in full prefill itself* (over exact rows, not the stale ones a preview pass sees).

Then ``predecessor``: each chunk but the first stored as computed right after its real
predecessor in the prompt (no filler context), with reuse and the preview selector on top: the
best a "related chunk" context (FusionRAG) could store for these prompts.

and prints, per variant, the share of items whose whole greedy answer (16 tokens) is full
prefill's, the answer KL (teacher-forced on full's answer) and first-token agreement. The
variants replace the engine's preview pass for the run (``blendrag.engine.request.prefill``'s
``PreviewPass``) by the same pass over a longer suffix (with RoPE tables long enough for it);
nothing else changes.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.compute.observers import KeyAttention
from blendrag.engine.request import prefill as request
from blendrag.engine.selection.preview import PreviewPass
from blendrag.eval.answer import answer_kl, forced_logits, greedy_answer, same_answer
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.ram import MemoryKVStore
from blendrag_bench.datasets import load_synthetic

NEW_TOKENS = 16
# answer tokens the preview pass also runs; or the attention the ranking takes instead
_extra: dict = {"ids": (), "attention": None}


class _PreviewWithAnswer(PreviewPass):
    """The preview pass over the suffix followed by ``_extra["ids"]`` (rows past the prompt are
    overwritten by decoding later; the buffer has room for them); its attention replaced by
    ``_extra["attention"]`` when set (the pass still loads the cached rows)."""

    def __init__(self, layout, device, feed) -> None:
        longer = dataclasses.replace(layout, suffix_ids=layout.suffix_ids + _extra["ids"])
        super().__init__(longer, device, feed)

    def result(self) -> tuple[torch.Tensor, int]:
        attention, keys = super().result()
        return (attention if _extra["attention"] is None else _extra["attention"]), keys


def _true_attention(engine: BlendEngine, layout, answer: tuple[int, ...]) -> torch.Tensor:
    """[layers, C]: the attention the suffix and ``answer`` pay each chunk token in a full
    prefill of the prompt and the answer (exact rows), summed over heads and queries."""
    longer = dataclasses.replace(layout, suffix_ids=layout.suffix_ids + answer)
    n = longer.num_tokens
    pre = engine.prefill(longer, BlendConfig(mode="full"))
    # every row is exact already: recompute the suffix and answer only, recording attention
    plan = LoopPlan(torch.tensor(longer.ids), torch.arange(layout.suffix_start, n))
    attention = KeyAttention(len(layout.prefix_ids), layout.suffix_start)
    engine.runner.run(plan, pre.fused, engine.runner.rope(n), (attention,))
    return attention.attention.cpu()


def _store_after_predecessor(engine: BlendEngine, layout) -> None:
    """Replace each stored chunk but the first by the chunk computed right after its
    predecessor in this prompt (its context shift kept, for the preview selector's prior)."""
    prefix = engine.cache.prefix(layout.chunk_prefix_ids)
    for before, ids in zip(layout.chunk_ids, layout.chunk_ids[1:]):
        key = engine.key(layout.chunk_prefix_ids, ids)
        old = engine.store.get(key)
        kv = engine.runner.compute_chunk(prefix, [*layout.chunk_prefix_ids, *before], ids)
        engine.store.put(key, ChunkKV(kv.keys, kv.values, old.token_ids, old.prefix_hash,
                                      old.profile, old.context_tag, old.context_shift))


def _run(engine: BlendEngine, layout, config: BlendConfig, extra: tuple[int, ...] = (),
         attention: torch.Tensor | None = None):
    """(prefill, greedy answer) of ``config``; ``extra``: answer tokens the preview pass runs;
    ``attention``: what the ranking takes instead of the preview pass's."""
    _extra["ids"] = tuple(t for t in extra if t not in engine.eos_token_ids)
    _extra["attention"] = attention
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
    request.PreviewPass = _PreviewWithAnswer  # type: ignore[misc]
    rope = engine.runner.rope  # tables past the prompt for the answer tokens the preview runs
    engine.runner.rope = lambda n: rope(n + len(_extra["ids"]))  # type: ignore[method-assign]
    blend = BlendConfig(ratio=args.ratio)
    names = ("reuse", "preview", "draft", "oracle", "true", "predecessor reuse",
             "predecessor preview")
    rows: dict[str, list[tuple[bool, float, bool]]] = {name: [] for name in names}
    for item in load_synthetic(limit=args.limit, offset=args.offset):
        engine.store = MemoryKVStore()  # this item's entries only (predecessor rows replace some)
        layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
        engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))
        _, full = _run(engine, layout, BlendConfig(mode="full"))
        _, reuse = _run(engine, layout, BlendConfig(mode="reuse"))
        answer = tuple(t for t in full.token_ids if t not in engine.eos_token_ids)
        variants = {"reuse": (BlendConfig(mode="reuse"), (), None), "preview": (blend, (), None),
                    "draft": (blend, reuse.token_ids, None), "oracle": (blend, answer, None),
                    "true": (blend, (), _true_attention(engine, layout, answer))}
        for name, (config, extra, attention) in variants.items():
            _score(rows[name], engine, layout, full, *_run(engine, layout, config, extra,
                                                          attention))
        _store_after_predecessor(engine, layout)
        for name, config in (("predecessor reuse", BlendConfig(mode="reuse")),
                             ("predecessor preview", blend)):
            _score(rows[name], engine, layout, full, *_run(engine, layout, config))
    n = len(rows["reuse"])
    print(f"{n} synthetic items from {args.offset}, ratio {args.ratio:g}, answers of "
          f"{NEW_TOKENS} tokens at most")
    print(f"{'variant':<20}{'same answer':>12}{'answer KL':>11}{'first token':>13}")
    for name, got in rows.items():
        print(f"{name:<20}{sum(r[0] for r in got) / n:>12.3f}{sum(r[1] for r in got) / n:>11.4f}"
              f"{sum(r[2] for r in got) / n:>13.3f}")


def _score(rows: list, engine: BlendEngine, layout, full, pre, own) -> None:
    kl = answer_kl(full.logits, forced_logits(engine, pre, own, full.token_ids))
    rows.append((same_answer(own.text, full.text), kl, own.token_ids[0] == full.token_ids[0]))


if __name__ == "__main__":
    main()
