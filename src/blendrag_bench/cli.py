"""`blendrag bench ...` sub-commands: ttft, store, match, quality and fidelity
(``quality_cli``)."""

from __future__ import annotations

import argparse
import sys

from blendrag.cli.options import (
    add_json_option,
    add_model_options,
    add_progress_option,
    add_store_dir_option,
)

RANDOM = "random"  # --model value of the benchmarks' default: random weights of a given shape


def register(sub: argparse._SubParsersAction) -> None:
    from blendrag_bench import precompute_cli, quality_cli, serve_cli

    group = sub.add_parser("bench", help="benchmarks: TTFT, store and precompute throughput, "
                           "chunk matching, answer quality, fidelity on your own prompts",
                           description="Benchmarks; docs/benchmarks.md has the figures they "
                                       "made, with the commands.")
    bench = group.add_subparsers(dest="bench", required=True,
                                 metavar="{ttft,chat,serve,store,precompute,match,quality,"
                                         "fidelity,calibration}")
    _register_ttft(bench)
    _register_chat(bench)
    serve_cli.register(bench)
    _register_store(bench)
    precompute_cli.register(bench)
    _register_match(bench)
    quality_cli.register(bench)
    quality_cli.register_fidelity(bench)
    _register_calibration(bench)


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


def _register_chat(bench: argparse._SubParsersAction) -> None:
    chat = bench.add_parser(
        "chat", help="a multi-turn RAG chat: each turn's TTFT with the prefix cache vs full",
        description="A chat over the same retrieved passages: per configuration "
                    "(full or blend with the engine's prefix cache, blend without) a "
                    "conversation of --turns turns, each turn's TTFT against a full prefill of "
                    "the same prompt, the tokens taken from the cache and the bytes it holds.")
    add_model_options(chat, default_help="the default model (the text workload)")
    chat.add_argument("--workloads", default="text,random,history",
                      help="text (a real model and MuSiQue passages), random (random weights, "
                           "token ids), history (new passages every turn ahead of the "
                           "conversation, as LlamaIndex's ContextChatEngine sends them), "
                           "random-history (the same on the random workload), "
                           "comma-separated (default: text,random,history)")
    chat.add_argument("--configs", default=",".join(_chat_configs()),
                      help=f"comma-separated (default: {','.join(_chat_configs())})")
    chat.add_argument("--turns", type=int, default=5, help="turns per conversation (default: 5)")
    chat.add_argument("--answer-tokens", type=int, default=32,
                      help="tokens per answer (default: 32)")
    chat.add_argument("--cache-mib", type=int, default=2048,
                      help="each prefix cache's budget in MiB (default: 2048)")
    chat.add_argument("--runs", type=int, default=1,
                      help="conversations per configuration; the median TTFT per turn is "
                           "reported (default: 1)")
    chat.add_argument("--turn-passages", type=int, default=2,
                      help="passages retrieved per turn in the history workload (default: 2)")
    chat.add_argument("--passage-tokens", type=int, default=None,
                      help="cut each passage of the text and history workloads to this many "
                           "tokens (default: whole)")
    chat.add_argument("--layers", type=int, default=32,
                      help="layers of the random workload's model (default: 32)")
    chat.add_argument("--chunks", type=int, default=6,
                      help="chunks of the random workload (default: 6)")
    chat.add_argument("--chunk-tokens", type=int, default=512,
                      help="tokens per chunk of the random workload (default: 512)")
    add_progress_option(chat)
    add_json_option(chat, "the records (turn, config, exact, prefix_tokens, ttft_s, "
                          "speedup_vs_full, ...)")
    chat.set_defaults(func=_chat)


def _register_calibration(bench: argparse._SubParsersAction) -> None:
    cal = bench.add_parser(
        "calibration", help="does a calibration generalise: calibrate on half a dataset's "
                            "passages, check the ratio on the other half's questions",
        description="Calibrate (as `blendrag calibrate` does, generic questions, no labels) on "
                    "the passages of half a dataset's items, then measure the chosen ratio and "
                    "the default on the other half's own questions; two targets (whole answers, "
                    "first sentences) read off the same answers.")
    add_model_options(cal)
    cal.add_argument("--dataset", default="synthetic",
                     help="synthetic, longfacts, musique or a file (default: synthetic)")
    cal.add_argument("--items", type=int, default=40,
                     help="dataset items, half for calibrating, half held out (default: 40)")
    cal.add_argument("--prompts", type=int, default=24,
                     help="calibration prompts (default: 24)")
    cal.add_argument("--per-prompt", type=int, default=4,
                     help="passages in each calibration prompt (default: 4)")
    cal.add_argument("--same-answer", type=float, default=0.9,
                     help="the target's share of answers equal to full's (default: 0.9)")
    cal.add_argument("--answer-kl", type=float, default=0.02,
                     help="the target's mean answer KL (default: 0.02)")
    cal.add_argument("--answer-tokens", type=int, default=32,
                     help="tokens of each answer (default: 32)")
    cal.add_argument("--questions", choices=("generic", "model"), default="generic",
                     help="the calibration's questions: generic, or written by the model "
                          "(default: generic)")
    add_progress_option(cal)
    add_json_option(cal, "the result")
    cal.set_defaults(func=_calibration)


def _calibration(args: argparse.Namespace) -> int:
    from blendrag.cli.options import apply_threads, emit, engine_spec
    from blendrag.cli.progress import Progress
    from blendrag_bench.calibration_bench import CalibrationBenchConfig, format_report, run

    try:
        cfg = CalibrationBenchConfig(args.dataset, args.items, args.prompts, args.per_prompt,
                                     same_answer=args.same_answer, answer_kl=args.answer_kl,
                                     answer_tokens=args.answer_tokens, questions=args.questions)
    except ValueError as exc:
        print(f"blendrag bench calibration: error: {exc}", file=sys.stderr)
        return 2
    apply_threads(args)
    engine = engine_spec(args).build()
    bars: dict[str, Progress] = {}

    def step(phase: str, done: int, total: int) -> None:
        bar = bars.setdefault(phase, Progress(phase, unit="prompts",
                                              enabled=not args.no_progress))
        bar(done, total)

    result = run(engine, cfg, step)
    emit(args, result, format_report(result))
    return 0


def _chat_configs() -> tuple[str, ...]:
    return ("full+prefix-cache", "blend+prefix-cache", "blend")


def _chat(args: argparse.Namespace) -> int:
    import torch

    from blendrag.cli.options import apply_threads, emit
    from blendrag.cli.progress import Progress
    from blendrag_bench.chat_bench import ChatBenchConfig, format_table, run
    from blendrag_bench.ttft import TTFTWorkload

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        random = TTFTWorkload(device=device, dtype=args.dtype, layers=args.layers,
                              chunks=args.chunks, chunk_tokens=args.chunk_tokens,
                              suffix_tokens=32)
        cfg = ChatBenchConfig(workloads=_names(args.workloads), model=args.model,
                              gguf_file=args.gguf_file, dtype=args.dtype, device=device,
                              random=random, turns=args.turns, answer_tokens=args.answer_tokens,
                              cache_bytes=args.cache_mib << 20, runs=args.runs,
                              configs=_names(args.configs), turn_passages=args.turn_passages,
                              passage_tokens=args.passage_tokens)
    except ValueError as e:
        print(f"blendrag bench chat: error: {e}", file=sys.stderr)
        return 2
    threads = apply_threads(args)
    print(f"torch {torch.__version__}, {threads} threads", file=sys.stderr)
    bars: dict[str, Progress] = {}

    def step(workload: str, done: int, total: int) -> None:
        if workload not in bars:
            bars[workload] = Progress(f"bench chat {workload}", "turns",
                                      enabled=not args.no_progress)
        bars[workload](done, total)

    records = run(cfg, on_turn=step)
    emit(args, {"threads": threads, "records": records}, format_table(records, cfg))
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


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
                      repeats=args.repeats)
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
    emit(args, {"threads": threads, "runs": runs, "summary": summary}, text)
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
