"""`blendrag bench quality`: answer quality vs TTFT of every mode and selector on a dataset.

``blendrag.bench.cli`` adds it to the ``bench`` group.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from blendrag.config import MODES, SELECTORS

_CHAT = {"auto": None, "on": True, "off": False}


def _csv(kind: type) -> Callable[[str], tuple]:
    """argparse type: a comma-separated list of ``kind`` values."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    return parse


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``quality`` to the ``blendrag bench`` group."""
    q = bench.add_parser("quality", help="answer quality vs TTFT of every mode and selector")
    q.add_argument("--dataset", default="synthetic",
                   help="'synthetic' (demo corpus, held-out seed), a CacheBlend .json or a LongBench .jsonl file")
    q.add_argument("--model", help="hub id or local path (default: the packaged demo model)")
    q.add_argument("--device", default="cpu")
    q.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    q.add_argument("--chat", default="auto", choices=list(_CHAT),
                   help="chat template around prompts (auto: off for the demo model, the tokenizer's otherwise)")
    q.add_argument("--limit", type=int, help="items to evaluate (default: 100 synthetic, every item of a file)")
    q.add_argument("--offset", type=int, default=0, help="items to skip first")
    q.add_argument("--modes", type=_csv(str), default=MODES, help=f"comma-separated subset of {','.join(MODES)}")
    q.add_argument("--selectors", type=_csv(str), default=SELECTORS,
                   help=f"comma-separated subset of {','.join(SELECTORS)}")
    q.add_argument("--ratios", type=_csv(float), default=(0.05, 0.10, 0.15, 0.20, 0.30, 1.0),
                   help="comma-separated recompute ratios of blend")
    q.add_argument("--max-new-tokens", type=int, default=32)
    q.add_argument("--ingest-order", default="prompt", choices=["prompt", "shuffled"],
                   help="order chunks are precomputed in: the neighbour each context profile is measured "
                        "after (prompt: the chunk before it in the prompt; shuffled: a seeded shuffle)")
    q.add_argument("--profile-neighbours", type=int, default=1, metavar="K",
                   help="measure each context profile after the K chunks before it in the ingestion order, "
                        "keeping each token's largest deviation (default 1)")
    q.add_argument("--no-warmup", action="store_true", help="time the first item's configs cold")
    q.add_argument("--out-dir", type=Path, default=Path("runs/quality"),
                   help="where table.md, table.csv and quality_vs_ttft.png go")
    q.add_argument("--json", type=Path, help="also write the per-config records as JSON here")
    q.set_defaults(func=_quality)


def _quality(args: argparse.Namespace) -> int:
    from blendrag.eval.datasets import dataset_name, load_dataset
    from blendrag.eval.quality import QualityConfig, run_quality
    from blendrag.eval.report import format_markdown, write_report

    try:
        config = QualityConfig(model=args.model, device=args.device, dtype=args.dtype, chat=_CHAT[args.chat],
                               modes=args.modes, selectors=args.selectors, ratios=args.ratios,
                               max_new_tokens=args.max_new_tokens, warmup=not args.no_warmup,
                               ingest_order=args.ingest_order, profile_neighbours=args.profile_neighbours)
        items = load_dataset(args.dataset, limit=args.limit, offset=args.offset)
        report = run_quality(items, config, dataset=dataset_name(args.dataset), on_item=_progress)
    except (ValueError, FileNotFoundError) as e:
        print(f"blendrag bench quality: {e}", file=sys.stderr)
        return 2
    paths = write_report(report, args.out_dir, args.json)
    print(format_markdown(report))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _progress(done: int, total: int) -> None:
    print(f"\ritem {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)
