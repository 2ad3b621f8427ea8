"""`blendrag bench precompute`: the local precompute job beside the Ray job on the same chunks
(``precompute_bench``). ``blendrag_bench.cli`` adds it to the ``bench`` group."""

from __future__ import annotations

import argparse
import sys

from blendrag.cli.options import add_json_option, add_model_options


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``precompute`` to the ``blendrag bench`` group."""
    p = bench.add_parser(
        "precompute", help="precompute throughput: one process vs Ray actors",
        description="Precompute the same chunks with the local job (one process) and, with "
                    "--ray, with Ray actors on a local single-node cluster; chunks/s and "
                    "tokens/s side by side, Ray's start-up (cluster, actors, model loads) apart.")
    add_model_options(p, default="demo", default_help="demo, the packaged tiny model")
    p.add_argument("--chunks", type=int, default=200, help="chunks precomputed (default: 200)")
    p.add_argument("--chunk-tokens", type=int, default=256,
                   help="tokens per chunk at most (default: 256)")
    p.add_argument("--ray", action="store_true",
                   help="also run the Ray job (needs pip install blendrag[ray]) (default: the "
                        "local job only)")
    p.add_argument("--actors", type=int, default=2,
                   help="with --ray: actors, and CPUs of the local cluster (default: 2)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="chunks per batch, in both jobs (default: 8)")
    add_json_option(p, "the records")
    p.set_defaults(func=_precompute)


def _precompute(args: argparse.Namespace) -> int:
    from blendrag.cli.options import emit
    from blendrag_bench.precompute_bench import PrecomputeBenchConfig, format_report, run

    try:
        cfg = PrecomputeBenchConfig(model=args.model, dtype=args.dtype,
                                    device=args.device or "cpu", chunks=args.chunks,
                                    chunk_tokens=args.chunk_tokens,
                                    actors=args.actors if args.ray else 0,
                                    threads=args.threads or 1, batch_size=args.batch_size)
        report = run(cfg, say=lambda line: print(line, file=sys.stderr))
    except (ValueError, ImportError, OSError) as e:
        print(f"blendrag bench precompute: error: {e}", file=sys.stderr)
        return 2
    emit(args, report, format_report(report))
    return 0
