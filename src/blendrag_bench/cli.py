"""`blendrag bench ...` sub-commands: ttft, store and match here; chat (``chat_cli``), serve
(``serve_cli``), precompute (``precompute_cli``), quality and fidelity (``quality_cli``) and
calibration (``calibration_cli``) in their own files."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from blendrag.cli.options import (
    add_json_option,
    add_model_options,
    add_progress_option,
    add_store_dir_option,
)

RANDOM = "random"  # --model value of the benchmarks' default: random weights of a given shape


def register(sub: argparse._SubParsersAction) -> None:
    from blendrag_bench import calibration_cli, chat_cli, precompute_cli, quality_cli, serve_cli

    group = sub.add_parser("bench", help="benchmarks: TTFT, store and precompute throughput, "
                           "chunk matching, answer quality, fidelity on your own prompts",
                           description="Benchmarks; docs/benchmarks.md has the figures they "
                                       "made, with the commands.")
    bench = group.add_subparsers(dest="bench", required=True,
                                 metavar="{ttft,chat,serve,store,precompute,match,quality,"
                                         "fidelity,calibration}")
    _register_ttft(bench)
    chat_cli.register(bench)
    serve_cli.register(bench)
    _register_store(bench)
    precompute_cli.register(bench)
    _register_match(bench)
    quality_cli.register(bench)
    quality_cli.register_fidelity(bench)
    calibration_cli.register(bench)


def _register_ttft(bench: argparse._SubParsersAction) -> None:
    ttft = bench.add_parser(
        "ttft", help="TTFT and peak memory of every mode, side by side",
        description="Time to first token and peak memory of HF's forward and every prefill "
                    "mode on the same prompt (chunk KVs precomputed first, untimed), then the "
                    "headline figures with their targets (PASS only when every run meets it).")
    _add_workload_args(ttft)
    ttft.add_argument("--hidden", type=int, default=512,
                      help="hidden size of the random model (default: 512)")
    ttft.add_argument("--heads", type=int, default=8,
                      help="attention heads of the random model (default: 8)")
    ttft.add_argument("--kv-heads", type=int, default=2,
                      help="KV heads of the random model (default: 2)")
    ttft.add_argument("--intermediate", type=int, default=1792,
                      help="MLP width of the random model (default: 1792)")
    ttft.add_argument("--suffix-tokens", type=int, default=64,
                      help="question tokens after the chunks (default: 64)")
    ttft.add_argument("--repeats", type=int, default=3,
                      help="timed calls per mode in a run, after one warm-up; the median is "
                           "reported (default: 3)")
    ttft.add_argument("--pass-attention", choices=("kernel", "explicit"), default="kernel",
                      help="the captured passes' attention (ComputeConfig.pass_attention): the "
                           "engine's kernel, or explicit probabilities and a GEMM for passes of "
                           "at most 128 tokens (default: kernel)")
    ttft.add_argument("--runs", type=int, default=1,
                      help="independent runs (model rebuilt each time); headline figures are "
                           "then the median with the min-max range (default: 1; use 3 or more "
                           "for figures you publish)")
    add_progress_option(ttft)
    add_json_option(ttft, "the records of every run and the headline figures")
    _add_tier_args(ttft)
    ttft.set_defaults(func=_ttft)


def _add_tier_args(ttft: argparse.ArgumentParser) -> None:
    """Flags of the loading benchmark (ttft_tiers.py): given --tier, the command compares
    sequential and pipelined loading and ratio=auto instead of every mode."""
    ttft.add_argument("--tier", choices=["ram", "disk", "redis", "redis_cluster", "s3"],
                      default=None,
                      help="time loading the cached rows from this tier: full, sequential load + "
                           "blend, pipelined blend, ratio=auto, load-only, compute-only")
    ttft.add_argument("--bandwidth", type=float, default=None, metavar="GBPS",
                      help="with --tier: throttle its reads to this many GB/s (default: its own "
                           "speed)")
    ttft.add_argument("--latency-us", type=float, default=0.0, metavar="US",
                      help="with --bandwidth: latency of each read in microseconds (default: 0)")
    ttft.add_argument("--selector", default="cacheblend",
                      help="with --tier: the blend selector (default: cacheblend)")
    ttft.add_argument("--ratio", type=float, default=0.20,
                      help="with --tier: the floor ratio (default: 0.20)")
    ttft.add_argument("--prefetch", type=int, default=4,
                      help="with --tier: layers read ahead when pipelined (default: 4)")
    ttft.add_argument("--protection", default=None, metavar="LIST",
                      help="with --tier: instead, what signing and encrypting the entries cost: "
                           "write, load, get and pipelined TTFT for each of the comma-separated "
                           "plain,signed,encrypted, side by side")


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the default benchmark workload (ttft.py's TTFTWorkload), shared by ttft and
    store."""
    add_model_options(parser, default=RANDOM,
                      default_help=f"{RANDOM}: random weights, Mistral-7B's depth and GQA")
    parser.add_argument("--layers", type=int, default=32,
                        help="layers of the random model (default: 32)")
    parser.add_argument("--chunks", type=int, default=6,
                        help="retrieved chunks in the prompt (default: 6)")
    parser.add_argument("--chunk-tokens", type=int, default=512,
                        help="tokens per chunk (default: 512)")


def _register_store(bench: argparse._SubParsersAction) -> None:
    store = bench.add_parser(
        "store", help="stored bytes/token, precompute and per-tier load throughput",
        description="Bytes stored per token against the KV formula, precompute throughput "
                    "against HF's forward, and each tier's load throughput against a plain read "
                    "of the same bytes.")
    _add_workload_args(store)
    store.add_argument("--repeats", type=int, default=9,
                       help="timed loads per tier; the median is reported (default: 9)")
    add_store_dir_option(store, default=None,
                         default_help="a temporary directory, removed after")
    store.add_argument("--no-redis", action="store_true",
                       help="skip the Redis tier (default: measured when redis-server exists)")
    store.add_argument("--kl-items", type=int, default=0, metavar="N",
                       help="also each stored format's first-token KL against the uncompressed "
                            "KV on the quality benchmark's model and first N MuSiQue items "
                            "(default: 0, not measured)")
    store.add_argument("--cluster", action="store_true",
                       help="also a local 3-node Redis Cluster (redis-server, redis-cli)")
    store.add_argument("--s3", action="store_true",
                       help="also a local S3 server, Ceph RGW (ceph-mon, ceph-osd, radosgw; "
                            "10-20 s to start)")
    add_json_option(store, "the figures")
    store.set_defaults(func=_store)


def _workload(args: argparse.Namespace, **shape):
    import torch

    from blendrag_bench.ttft import TTFTWorkload

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return TTFTWorkload(model=None if args.model == RANDOM else args.model,
                        gguf_file=args.gguf_file, device=device, dtype=args.dtype,
                        layers=args.layers, chunks=args.chunks, chunk_tokens=args.chunk_tokens,
                        **shape)


def _register_match(bench: argparse._SubParsersAction) -> None:
    match = bench.add_parser(
        "match", help="time to find ingested chunks in a flat prompt, by index size",
        description="Chunk matching: build a text index of N chunks (each size in a fresh "
                    "process), then time finding the indexed chunks written into a long prompt.")
    match.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000],
                       help="indexed chunk counts (default: 1000 100000 1000000)")
    match.add_argument("--chunk-chars", type=int, default=400,
                       help="characters per indexed chunk (default: 400)")
    match.add_argument("--prompt-chars", type=int, default=16_000,
                       help="prompt length (default: 16000 characters, ~4,000 tokens)")
    match.add_argument("--prompt-chunks", type=int, default=8,
                       help="indexed chunks written into the prompt (default: 8)")
    match.add_argument("--repeats", type=int, default=200,
                       help="timed finds per size (default: 200)")
    add_json_option(match, "the records")
    match.set_defaults(func=_match)


def _match(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from blendrag.cli.options import emit
    from blendrag_bench.match import MatchBenchConfig, format_table, run

    cfg = MatchBenchConfig(sizes=tuple(args.sizes), chunk_chars=args.chunk_chars,
                           prompt_chars=args.prompt_chars, prompt_chunks=args.prompt_chunks,
                           repeats=args.repeats)
    records = run(cfg)
    emit(args, {"config": asdict(cfg), "records": [asdict(r) for r in records]},
         format_table(records, cfg))
    return 0


def _ttft(args: argparse.Namespace) -> int:
    import torch

    from blendrag.cli.options import apply_threads, emit
    from blendrag.cli.progress import Progress
    from blendrag_bench.ttft import format_table, run
    from blendrag_bench.ttft_summary import format_summary, summarize

    try:
        if args.runs < 1:
            raise ValueError(f"--runs must be >= 1, got {args.runs}")
        w = _workload(args, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                      intermediate=args.intermediate, suffix_tokens=args.suffix_tokens,
                      repeats=args.repeats, pass_attention=args.pass_attention)
    except ValueError as e:
        print(f"blendrag bench ttft: error: {e}", file=sys.stderr)
        return 2
    threads = apply_threads(args)
    print(f"torch {torch.__version__}, {threads} threads", file=sys.stderr)
    if args.tier is not None:
        return _ttft_tier(args, w, threads)
    runs, tables = [], []
    for i in range(1, args.runs + 1):
        label = f"run {i}/{args.runs}" if args.runs > 1 else "bench ttft"
        bars: dict[str, Progress] = {}

        def step(phase: str, done: int, total: int, label: str = label, bars=bars) -> None:
            if phase not in bars:
                unit = {"timing": "timed calls", "memory": "modes"}.get(phase, "")
                bars[phase] = Progress(f"{label} {phase}", unit, enabled=not args.no_progress)
            bars[phase](done, total)

        records = run(w, on_step=step)
        runs.append(records)
        tables.append(format_table(records, w))
    summary = summarize(runs)
    text = "\n\n".join(tables) + "\n\n" + "\n".join(format_summary(summary))
    emit(args, {"threads": threads, "torch": torch.__version__,
                "workload": dataclasses.asdict(w), "runs": runs, "summary": summary}, text)
    return 0


def _shared_tiers(args: argparse.Namespace) -> tuple[str, ...]:
    asked = {"redis": not args.no_redis, "redis_cluster": args.cluster, "s3": args.s3}
    return tuple(t for t, on in asked.items() if on)


def _ttft_tier(args: argparse.Namespace, w, threads: int) -> int:
    from blendrag.cli.options import emit
    from blendrag_bench.ttft_tiers import TierBenchConfig, format_table, run, verdicts

    try:
        cfg = TierBenchConfig(workload=w, tier=args.tier, bandwidth_gbps=args.bandwidth,
                              latency_us=args.latency_us, selector=args.selector,
                              floor=args.ratio, prefetch=args.prefetch)
    except ValueError as e:
        print(f"blendrag bench ttft: error: {e}", file=sys.stderr)
        return 2
    if args.protection is not None:
        return _ttft_protection(args, cfg, threads)
    records = run(cfg)
    emit(args, {"threads": threads, "tier": args.tier, "bandwidth_gbps": args.bandwidth,
                "latency_us": args.latency_us, "records": records,
                "verdicts": verdicts(records, cfg.pipeline_target)}, format_table(records, cfg))
    return 0


def _ttft_protection(args: argparse.Namespace, cfg, threads: int) -> int:
    from blendrag.cli.options import emit
    from blendrag_bench.ttft_protection import format_table, run

    try:
        records = run(cfg, tuple(p.strip() for p in args.protection.split(",")))
    except ValueError as e:
        print(f"blendrag bench ttft: error: {e}", file=sys.stderr)
        return 2
    emit(args, {"threads": threads, "tier": args.tier, "records": records},
         format_table(records, cfg))
    return 0


def _store(args: argparse.Namespace) -> int:
    from blendrag.cli.options import apply_threads, emit
    from blendrag_bench.store import StoreBenchConfig, format_report, ratios, run

    try:
        config = StoreBenchConfig(workload=_workload(args), repeats=args.repeats,
                                  directory=args.store_dir, shared=_shared_tiers(args),
                                  kl_items=args.kl_items)
    except ValueError as e:
        print(f"blendrag bench store: error: {e}", file=sys.stderr)
        return 2
    apply_threads(args)
    report = run(config)
    emit(args, report, format_report(report) + "\n" + "\n".join(ratios(report)))
    return 0
