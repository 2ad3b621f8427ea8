"""`blendrag demo`."""

from __future__ import annotations

import argparse
from pathlib import Path

from blendrag.cli.options import add_model_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="ingest passages into Chroma, precompute their KVs, answer "
                                    "with full / reuse / blend side by side", description=__doc__)
    add_model_options(p)
    p.add_argument("--workdir", type=Path, default=Path("runs/demo"),
                   help="where the Chroma collection, KV store and text index go (default "
                        "runs/demo)")
    p.add_argument("--questions", type=int, default=None,
                   help="questions to ask (default: all 12 of the real corpus; 12 synthetic with "
                        "--model demo)")
    p.add_argument("--ratio", type=float, default=None,
                   help="blend recompute ratio (default: BlendConfig's)")
    p.set_defaults(func=_demo)

def _demo(args: argparse.Namespace) -> int:

    from blendrag.config import BlendConfig
    from blendrag_demo.run import DemoConfig, main_cli

    blend = BlendConfig() if args.ratio is None else BlendConfig(ratio=args.ratio)
    return main_cli(DemoConfig(model=args.model, gguf_file=args.gguf_file, workdir=args.workdir,
                               questions=args.questions, blend=blend, device=args.device))
