"""`blendrag bench chat`: a multi-turn RAG chat, each turn's TTFT with the prefix cache
against a full prefill (``chat_bench.py``). ``blendrag_bench.cli`` adds it to the ``bench``
group."""

from __future__ import annotations

import argparse
import sys

from blendrag.cli.options import (
    add_json_option,
    add_model_options,
    add_progress_option,
    csv_of,
)

# chat_config.CONFIGS's names (a test holds them equal): building the parser imports no torch
CHAT_CONFIGS = ("full+prefix-cache", "blend+prefix-cache", "blend")


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``chat`` to the ``blendrag bench`` group."""
    chat = bench.add_parser(
        "chat", help="a multi-turn RAG chat: each turn's TTFT with the prefix cache vs full",
        description="A chat over the same retrieved passages: per configuration "
                    "(full or blend with the engine's prefix cache, blend without) a "
                    "conversation of --turns turns, each turn's TTFT against a full prefill of "
                    "the same prompt, the tokens taken from the cache and the bytes it holds.")
    add_model_options(chat, default_help="the default model (the text workload)")
    chat.add_argument("--workloads", type=csv_of(str.strip), default="text,random,history",
                      help="text (a real model and MuSiQue passages), random (random weights, "
                           "token ids), history (new passages every turn ahead of the "
                           "conversation, as LlamaIndex's ContextChatEngine sends them), "
                           "random-history (the same on the random workload), "
                           "comma-separated (default: text,random,history)")
    chat.add_argument("--configs", type=csv_of(str.strip), default=",".join(CHAT_CONFIGS),
                      help=f"comma-separated (default: {','.join(CHAT_CONFIGS)})")
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
        cfg = ChatBenchConfig(workloads=args.workloads, model=args.model,
                              gguf_file=args.gguf_file, dtype=args.dtype, device=device,
                              random=random, turns=args.turns, answer_tokens=args.answer_tokens,
                              cache_bytes=args.cache_mib << 20, runs=args.runs,
                              configs=args.configs, turn_passages=args.turn_passages,
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
