"""`blendrag bench serve`: many users on one engine against one request at a time
(``serve.py``). ``blendrag_bench.cli`` adds it to the ``bench`` group."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from blendrag.cli.options import (
    add_json_option,
    add_model_options,
    csv_of,
    emit,
    engine_threads,
)


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``blendrag bench`` group."""
    s = bench.add_parser(
        "serve", help="throughput and latency of many users on one engine vs one at a time",
        description="Closed-loop users and Poisson arrivals over the same RAG prompts, through "
                    "the engine's scheduler (batched decoding), against the engine serving one "
                    "request at a time: requests/s, tokens/s, p50/p95 TTFT and time per output "
                    "token, side by side.")
    add_model_options(s)
    s.add_argument("--users", type=csv_of(int), default=(1, 2, 4),
                   help="comma-separated closed-loop user counts (default: 1,2,4; a GPU: "
                        "1,4,16)")
    s.add_argument("--rates", type=csv_of(float), default=(),
                   help="comma-separated Poisson arrival rates, requests/s (default: none)")
    s.add_argument("--requests", type=int, default=8, help="requests per run (default: 8)")
    s.add_argument("--rounds", type=int, default=1,
                   help="served runs send the requests this many times over: past their "
                        "first request the users keep their own rhythm, and 'after each "
                        "user's first' reports that (default: 1)")
    s.add_argument("--passages", type=int, default=5,
                   help="retrieved passages per prompt (default: 5)")
    s.add_argument("--passage-tokens", type=int, default=100,
                   help="each passage cut to this many tokens (default: 100)")
    s.add_argument("--answer-tokens", type=int, default=32,
                   help="tokens decoded per answer, EOS ignored (default: 32)")
    s.add_argument("--modes", default="full,default",
                   help="comma-separated: full, default (default: full,default)")
    s.add_argument("--serve-threads", type=int, default=None, metavar="N",
                   help="torch CPU threads of the scheduler's steps (default: --threads)")
    s.add_argument("--prefill-workers", type=int, default=None, metavar="N",
                   help="threads prefilling beside the decoding loop; 0: between its steps "
                        "(ServingConfig.prefill_workers; default: 1 on a GPU, and on a CPU "
                        "whose cores hold both threads)")
    s.add_argument("--prefill-piece-tokens", type=int, default=None, metavar="N",
                   help="a longer prefill runs in pieces of N tokens, the running requests "
                        "decoding between them; 0: whole (ServingConfig.prefill_piece_tokens; "
                        "default: 512 on a CPU, 4096 on a GPU)")
    s.add_argument("--slot-tokens", type=int, default=4096, metavar="N",
                   help="rows of each KV slab slot; 0: no slab (ServingConfig.slot_tokens; "
                        "default: 4096)")
    s.add_argument("--pack-tokens", type=int, default=None, metavar="N",
                   help="requests prefilled together have their main passes packed into one "
                        "forward of at most N computed tokens; 0: each alone "
                        "(ServingConfig.pack_tokens; default: 4096 on a GPU, 0 on a CPU)")
    add_json_option(s, "one record per run")
    s.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from blendrag.engine.engine import BlendEngine
    from blendrag_bench.serve import ServeBenchConfig, run
    from blendrag_bench.serve_report import format_row

    try:
        cfg = ServeBenchConfig(users=args.users, rates=args.rates, requests=args.requests,
                               rounds=args.rounds,
                               passages=args.passages, passage_tokens=args.passage_tokens,
                               answer_tokens=args.answer_tokens,
                               modes=tuple(m for m in args.modes.split(",") if m),
                               serve_threads=args.serve_threads,
                               prefill_workers=args.prefill_workers,
                               prefill_piece_tokens=args.prefill_piece_tokens,
                               slot_tokens=args.slot_tokens, pack_tokens=args.pack_tokens)
    except ValueError as e:
        print(f"blendrag bench serve: error: {e}", file=sys.stderr)
        return 2
    engine = BlendEngine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                         gguf_file=args.gguf_file, threads=engine_threads(args))
    quiet = args.json == "-"
    if not quiet:
        print(f"bench serve: {engine.name} on {engine.device}, {cfg.requests} requests of "
              f"{cfg.passages} x {cfg.passage_tokens}-token passages, {cfg.answer_tokens}-token "
              "answers; against one request at a time")
    rows = run(engine, cfg, on_row=None if quiet else lambda r: print(format_row(r), flush=True))
    emit(args, {"model": engine.name, "device": str(engine.device),
                "workload": dataclasses.asdict(cfg), "rows": rows}, "")
    return 0
