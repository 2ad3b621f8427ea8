"""`blendrag demo`."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="ingest, precompute KVs, answer through LangChain/LlamaIndex, score every mode")
    p.add_argument("--model", help="model directory or hub id (default: the embedded demo model)")
    p.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    p.add_argument("--questions", type=int, default=3, help="questions through each framework chain")
    p.add_argument("--eval-questions", type=int, default=300, help="held-out questions scored per mode")
    p.add_argument("--ratio", type=float, default=0.15, help="blend recompute ratio")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from blendrag.demo.run import DemoConfig, run

    run(DemoConfig(model=args.model, workdir=args.workdir, questions=args.questions,
                   eval_questions=args.eval_questions, ratio=args.ratio))
    return 0
