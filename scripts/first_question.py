"""Print what the first question on new documents costs: a blend request whose passages are in
no store, against a full prefill of the same prompt, with the default backfill
(``LoadingConfig(full_when_missing=0.5)``: the request runs an exact full prefill and its
passages are computed and stored off its path) and without it (``full_when_missing=None``:
the passages computed first, in the request), and the next request over them
(docs/benchmarks.md, "The first question on new documents").

Every round takes questions whose passages no engine has seen, on the default model (or
``--model``), in the default ingestion context; medians over the rounds.

    .venv/bin/python scripts/first_question.py [--model demo] [--dataset musique] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.selection.controller import LoadingConfig
from blendrag.eval.metrics import speedup_words
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag_bench.named_datasets import load_dataset

FULL = BlendConfig(mode="full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dataset", default="musique")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    items = load_dataset(args.dataset, limit=3 * args.rounds)
    base = BlendEngine.from_pretrained(args.model, device="cpu")
    # "computed first" before "backfill": the backfill's worker must not share the CPU with it
    engines = {
        "computed first": BlendEngine(base.model, base.tokenizer,
                                      loading=LoadingConfig(full_when_missing=None)),
        "backfill": BlendEngine(base.model, base.tokenizer),  # the default loading config
    }
    blend = BlendConfig()  # the default config, as a user runs it
    rows: dict[str, list[float]] = {k: [] for k in ("full", "backfill", "next", "computed first")}
    hits: list[tuple[int, int]] = []
    for r in range(args.rounds):
        item = items[3 * r]  # a question of its own each round: new passages
        layout = base.build_prompt(item.prefix, list(item.chunks), item.suffix)
        rows["full"].append(_ttft(base, layout, FULL))
        for name, engine in engines.items():
            rows[name].append(_ttft(engine, layout, blend))
        engines["backfill"].cache.backfill.wait()
        t0 = time.perf_counter()
        nxt = engines["backfill"].prefill(layout, blend)
        rows["next"].append(time.perf_counter() - t0)
        hits.append((nxt.stats.cache.chunk_hits, len(layout.chunk_ids)))
        print(f"round {r + 1}/{args.rounds}: {layout.num_tokens} tokens, "
              + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in rows.items()), flush=True)
    full = statistics.median(rows["full"])
    print(f"\n{args.model}, {args.dataset}, {args.rounds} rounds (medians, TTFT):")
    print(f"  full prefill                         {full * 1e3:8.0f} ms")
    for label, key in (("blend, no store (default: backfill)", "backfill"),
                       ("blend, the next request", "next"),
                       ("blend, passages computed first", "computed first")):
        t = statistics.median(rows[key])
        print(f"  {label:<37}{t * 1e3:8.0f} ms   {full / t:5.2f}x: "
              f"{speedup_words(full / t)}  ({t / full:.2f}x full's TTFT)")
    print(f"  the next request's chunk hits: {sum(h for h, _ in hits)} of "
          f"{sum(n for _, n in hits)}")


def _ttft(engine: BlendEngine, layout, config: BlendConfig) -> float:
    t0 = time.perf_counter()
    engine.prefill(layout, config)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
