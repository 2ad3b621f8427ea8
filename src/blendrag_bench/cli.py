"""`blendrag bench ...` sub-commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from blendrag.cli.options import add_model_options


def register(sub: argparse._SubParsersAction) -> None:
    from blendrag_bench import quality_cli

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    quality_cli.register(bench)
    ttft = bench.add_parser("ttft", help="TTFT and peak memory of every mode, side by side")
    _add_workload_args(ttft)
    ttft.add_argument("--hidden", type=int, default=512)
    ttft.add_argument("--heads", type=int, default=8)
    ttft.add_argument("--kv-heads", type=int, default=2)
    ttft.add_argument("--intermediate", type=int, default=1792)
    ttft.add_argument("--suffix-tokens", type=int, default=64)
    ttft.add_argument("--repeats", type=int, default=3)
    ttft.add_argument("--json", type=Path, help="also write the records as JSON here")
    ttft.set_defaults(func=_ttft)
    _register_store(bench)
    _register_match(bench)


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the default benchmark workload (ttft.py's TTFTWorkload), shared by ttft and
    store."""
    add_model_options(parser, default=None,
                      default_help="random weights, Mistral-7B's depth and GQA")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--chunk-tokens", type=int, default=512)


def _register_store(bench: argparse._SubParsersAction) -> None:
    store = bench.add_parser("store",
                             help="stored bytes/token, precompute and per-tier load throughput")
    _add_workload_args(store)
    store.add_argument("--repeats", type=int, default=9,
                       help="timed loads per tier (median reported)")
    store.add_argument("--dir", type=Path,
                       help="disk tier directory (default: a temporary one, removed after)")
    store.add_argument("--no-redis", action="store_true", help="skip the Redis tier")
    store.add_argument("--threads", type=int,
                       help="torch CPU threads (default: torch's own choice)")
    store.add_argument("--json", type=Path, help="also write the figures as one JSON object here")
    store.set_defaults(func=_store)


def _register_match(bench: argparse._SubParsersAction) -> None:
    match = bench.add_parser("match", help="time to find ingested chunks in a flat prompt, by "
                             "index size")
    match.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000],
                       help="indexed chunk counts")
    match.add_argument("--chunk-chars", type=int, default=400)
    match.add_argument("--prompt-chars", type=int, default=16_000,
                       help="prompt length (16,000 characters: ~4,000 tokens)")
    match.add_argument("--prompt-chunks", type=int, default=8,
                       help="indexed chunks written into the prompt")
    match.add_argument("--repeats", type=int, default=200, help="timed finds per size")
    match.add_argument("--json", type=Path, help="also write the records as JSON here")
    match.set_defaults(func=_match)


def _match(args: argparse.Namespace) -> int:
    from blendrag_bench.match import MatchBenchConfig, format_table, run, write_json

    cfg = MatchBenchConfig(sizes=tuple(args.sizes), chunk_chars=args.chunk_chars,
                           prompt_chars=args.prompt_chars, prompt_chunks=args.prompt_chunks,
                           repeats=args.repeats)
    records = run(cfg)
    print(format_table(records, cfg))
    if args.json:
        write_json(records, cfg, args.json)
        print(f"wrote {args.json}")
    return 0


def _ttft(args: argparse.Namespace) -> int:
    import torch

    from blendrag_bench.ttft import TTFTWorkload, format_table, ratios, run, write_json

    w = TTFTWorkload(model=args.model, gguf_file=args.gguf_file, device=args.device or "cpu",
                     dtype=args.dtype,
                     layers=args.layers,
                     hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                     intermediate=args.intermediate,
                     chunks=args.chunks, chunk_tokens=args.chunk_tokens,
                     suffix_tokens=args.suffix_tokens,
                     repeats=args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    records = run(w)
    print(format_table(records, w))
    print("\n".join(ratios(records)))
    if args.json:
        write_json(records, args.json)
        print(f"wrote {args.json}")
    return 0


def _store(args: argparse.Namespace) -> int:
    import torch

    from blendrag_bench.store import StoreBenchConfig, format_report, ratios, run, write_json
    from blendrag_bench.ttft import TTFTWorkload

    w = TTFTWorkload(model=args.model, gguf_file=args.gguf_file, device=args.device or "cpu",
                     dtype=args.dtype,
                     layers=args.layers,
                     chunks=args.chunks, chunk_tokens=args.chunk_tokens)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(StoreBenchConfig(workload=w, repeats=args.repeats, directory=args.dir,
                                  redis=not args.no_redis))
    print(format_report(report))
    print("\n".join(ratios(report)))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0
