"""`blendrag demo`: blendrag's main job end to end (``blendrag_demo.run``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blendrag.cli.options import add_model_options, add_store_dir_option


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="ingest passages into Chroma, precompute their KVs, answer with full / "
                     "reuse / blend side by side",
        description="Ingest a corpus into a Chroma collection (MiniLM embeddings) with each "
                    "passage's KV precomputed into the KV store, then answer questions through "
                    "a LangChain retrieval chain in full, reuse and blend mode, side by side, "
                    "and summarize accuracy and TTFT per mode. A second run reuses the "
                    "collection and the stored KVs.")
    add_model_options(p)
    add_store_dir_option(p)
    p.add_argument("--out-dir", type=Path, default=Path("runs/demo"), metavar="DIR",
                   help="where the Chroma collection and the text index go (default: runs/demo)")
    p.add_argument("--questions", type=int, default=None,
                   help="questions to ask (default: all 12 of the real corpus; 12 synthetic with "
                        "--model demo)")
    p.add_argument("--ratio", type=float, default=None,
                   help="blend recompute ratio (default: BlendConfig's, 0.20)")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from blendrag.cli.options import apply_threads
    from blendrag.config import BlendConfig
    from blendrag_demo.run import DemoConfig, main_cli

    try:
        blend = BlendConfig() if args.ratio is None else BlendConfig(ratio=args.ratio)
        cfg = DemoConfig(model=args.model, gguf_file=args.gguf_file, out_dir=args.out_dir,
                         store_dir=args.store_dir, questions=args.questions, blend=blend,
                         device=args.device, dtype=args.dtype)
    except ValueError as e:
        print(f"blendrag demo: error: {e}", file=sys.stderr)
        return 2
    apply_threads(args)
    return main_cli(cfg)
