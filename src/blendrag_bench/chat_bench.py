"""A multi-turn chat over the same retrieved passages: each turn's TTFT with the engine's prefix
cache against a full prefill of the same prompt, side by side.

Every turn sends what a RAG chat sends (LlamaIndex's context chat engine, LangChain's chains
with message history): the passages, the history, the new question. Per configuration a
conversation runs on its own engine (its own prefix cache, the chunk store shared, its KVs
precomputed before anything is timed), and each turn's prompt is also prefilled in full by an
engine without a prefix cache: that is the turn's baseline. A cached configuration that is not
exact (blend with the prefix cache) is also set against the exact path on its own prompts: an
exact twin (a full prefill with a prefix cache of its own) gets the same prompt every turn,
timed, then the same answer (teacher-forced, untimed), so that both caches hold the same
conversation; each turn's ``vs exact`` is the twin's TTFT over the configuration's.

Three workloads:

- ``text``: a real model and tokenizer (default: the default model), 6 MuSiQue passages
  (~3,300 tokens with its tokenizer) in the CacheBlend prompt as the first user message of the
  chat template, then a follow-up question per turn, answers generated greedily; each prompt
  cut at the passages as a framework LLM cuts a flat prompt (``find_layout``).
- ``random``: random weights of the ``bench ttft`` shape (32 layers), token ids only: a 32-token
  prefix, 6 x 512 chunk tokens, 32-token questions; each answer is fixed random ids decoded
  after the prefill (teacher-forced), so its rows are the ones a generated answer leaves.
- ``history``: new passages every turn ahead of the conversation (LlamaIndex's
  ``ContextChatEngine``): with history reuse against without it and against full prefill,
  TTFT and whole answers (``chat_history.py``); ``random-history``: the same on the random
  workload's shape (new random chunks every turn), TTFT only.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine.engine import BlendEngine
from blendrag.integration.flat_prompt import find_layout
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.prompt import PromptLayout
from blendrag_bench.chat_config import CONFIGS, FULL, ChatBenchConfig
from blendrag_bench.chat_history import (
    format_history,
    run_history,
    run_random_history,
    sibling,
    teacher_forced,
)
from blendrag_bench.datasets import load_musique
from blendrag_bench.quality import fit_item
from blendrag_bench.ttft import build_engine

EXACT_TARGET = 0.95  # a cached configuration's TTFT against the exact path on its own prompt
FOLLOW_UPS = ("Which passage says so?", "Who else is named in that passage?",
              "What is the first passage about?", "Answer the first question again, briefly.")


Turn = Callable[[BlendEngine, BlendConfig, int], tuple[PromptLayout, dict, list[int]]]
"""(engine, config, turn) -> (the turn's prompt, its stats, its answer's ids), the answer's rows
kept."""
Conversation = Callable[[], Turn]
"""A new conversation: its turns, one call each."""


def run(cfg: ChatBenchConfig, on_turn: Callable[[str, int, int], None] | None = None) -> list[dict]:
    """One record per (workload, config, turn); ``on_turn(workload, done, total)``: progress."""
    records = []
    for name in cfg.workloads:
        if name in ("history", "random-history"):  # a conversation of its own (chat_history.py)
            records += (run_history if name == "history" else run_random_history)(cfg, on_turn)
            continue
        base, new_conversation = _text(cfg) if name == "text" else _random(cfg)
        plain = sibling(base, 0)  # the full prefill every turn is measured against
        total, done = len(cfg.configs) * cfg.runs * cfg.turns, 0
        for label in cfg.configs:
            config, cached = CONFIGS[label]
            samples: list[list[dict]] = []
            for _ in range(cfg.runs):
                engine = sibling(base, cfg.cache_bytes if cached else 0)
                exact = config.mode in ("full", "prefix")
                twin = sibling(base, cfg.cache_bytes) if cached and not exact else None
                conversation, turns = new_conversation(), []
                for turn in range(1, cfg.turns + 1):
                    layout, stats, answer = conversation(engine, config, turn)
                    full = plain.prefill(layout, FULL).stats
                    record = _record(name, label, config, turn, layout, stats, full, engine)
                    if twin is not None:  # the exact path on this conversation's prompt
                        twin_stats = teacher_forced(twin, layout, FULL, answer).stats
                        # (the Prefill let go: the twin's next turn gets the pooled buffer, as
                        # the config's engine does; a buffer of its own costs its page faults)
                        record["exact_ttft_s"] = twin_stats.timing.ttft_s
                        record["exact_prefix_tokens"] = twin_stats.cache.prefix_cache_tokens
                    turns.append(record)
                    done += 1
                    if on_turn is not None:
                        on_turn(name, done, total)
                samples.append(turns)
            records += [_median(rows) for rows in zip(*samples)]
    return records


def _record(workload: str, label: str, config: BlendConfig, turn: int, layout: PromptLayout,
            stats: dict, full: object, engine: BlendEngine) -> dict:
    full_s = full.timing.ttft_s  # type: ignore[attr-defined]
    cache = engine.prefix_cache
    return {"workload": workload, "turn": turn, "config": label,
            "exact": config.mode in ("full", "prefix"), "prompt_tokens": layout.num_tokens,
            "prefix_tokens": stats["prefix_cache_tokens"],
            "prefix_exact": stats["prefix_cache_exact"],
            "computed_tokens": stats["computed_per_layer"][0] + stats["bridged_tokens"],
            "ttft_s": stats["ttft_s"], "full_ttft_s": full_s,
            "speedup_vs_full": full_s / stats["ttft_s"],
            "cache_bytes": cache.bytes if cache is not None else 0}


def _median(rows: tuple[dict, ...]) -> dict:
    """One turn's record over the runs: median times, the first run's counts."""
    out = dict(rows[0])
    for key in ("ttft_s", "full_ttft_s", "exact_ttft_s"):
        if key in out:
            out[key] = statistics.median(r[key] for r in rows)
    out["speedup_vs_full"] = out["full_ttft_s"] / out["ttft_s"]
    if "exact_ttft_s" in out:
        out["vs_exact"] = out["exact_ttft_s"] / out["ttft_s"]
    return out


# ---- the text workload ------------------------------------------------------------------------


def _text(cfg: ChatBenchConfig) -> tuple[BlendEngine, Conversation]:
    # threads=None: the process's count (the CLI's --threads)
    kw = {"dtype": cfg.dtype, "device": cfg.device, "gguf_file": cfg.gguf_file, "threads": None}
    base = BlendEngine.from_pretrained(cfg.model or DEFAULT_MODEL, **kw)
    # one MuSiQue question with its passages, in the CacheBlend prompt
    item = load_musique(limit=1, passages=cfg.passages)[0]
    if cfg.passage_tokens is not None:
        item = fit_item(base, item, cfg.passage_tokens)
    first = item.prefix + "".join(item.chunks) + item.suffix
    index = ChunkTextIndex()
    generation = GenerationConfig(max_new_tokens=cfg.answer_tokens)
    ingested: list[bool] = []

    def new_conversation() -> Turn:
        turns: list[dict[str, str]] = []

        def next_turn(engine: BlendEngine, config: BlendConfig, turn: int):
            follow_up = FOLLOW_UPS[(turn - 2) % len(FOLLOW_UPS)]
            turns.append({"role": "user", "content": first if turn == 1 else follow_up})
            prompt = _render(engine, turns)
            layout = find_layout(engine.prompts, prompt, index, item.chunks, templated=True).layout
            if not ingested:  # ingestion, not timed
                engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)
                ingested.append(True)
            result = engine.generate(layout, config, generation)
            turns.append({"role": "assistant", "content": result.text})
            return layout, result.stats.to_dict(), result.token_ids

        return next_turn

    return base, new_conversation


def _render(engine: BlendEngine, turns: list[dict[str, str]]) -> str:
    """The conversation in the model's chat template (a plain transcript without one)."""
    if getattr(engine.tokenizer, "chat_template", None) and engine.prompts is not None:
        return engine.prompts.render_chat(turns)  # the engine's own rendering (a fixed date)
    lines = [f"{t['role'].capitalize()}: {t['content']}" for t in turns]
    return "\n".join(lines) + "\nAssistant:"


# ---- the random workload ----------------------------------------------------------------------


def _random(cfg: ChatBenchConfig) -> tuple[BlendEngine, Conversation]:
    w = cfg.random
    base = build_engine(w)
    g = torch.Generator().manual_seed(w.seed)
    vocab = base.model.config.vocab_size

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prefix, chunks = ids(w.prefix_tokens), [ids(w.chunk_tokens) for _ in range(w.chunks)]
    questions = [ids(w.suffix_tokens) for _ in range(cfg.turns)]
    answers = [ids(cfg.answer_tokens) for _ in range(cfg.turns)]
    base.precompute(prefix, chunks)  # ingestion, not timed

    def next_turn(engine: BlendEngine, config: BlendConfig, turn: int):
        history = [t for i in range(turn - 1) for t in (*questions[i], *answers[i])]
        layout = PromptLayout(prefix, chunks, [*history, *questions[turn - 1]])
        pre = teacher_forced(engine, layout, config, answers[turn - 1])
        return layout, pre.stats.to_dict(), answers[turn - 1]

    return base, lambda: next_turn


# ---- report -----------------------------------------------------------------------------------


def format_table(records: list[dict], cfg: ChatBenchConfig) -> str:
    lines = []
    for workload in cfg.workloads:
        if workload in ("history", "random-history"):
            lines += [format_history(records, cfg, workload), ""]
            continue
        rows = [r for r in records if r["workload"] == workload]
        lines += [f"workload: {workload}; {cfg.turns} turns, answers of up to "
                  f"{cfg.answer_tokens} tokens; median of {cfg.runs} conversation(s) per config",
                  f"{'turn':>4} {'config':<20}{'exact':>6}{'prompt':>8}{'cached':>8}"
                  f"{'computed':>9}{'TTFT ms':>10}{'full ms':>10}{'speedup':>9}{'cache MiB':>11}"
                  f"{'exact ms':>10}{'vs exact':>10}"]
        for r in rows:
            twin = (f"{r['exact_ttft_s'] * 1e3:>10.1f}{r['vs_exact']:>9.2f}x"
                    if "vs_exact" in r else f"{'-':>10}{'-':>10}")
            lines.append(f"{r['turn']:>4} {r['config']:<20}{'yes' if r['exact'] else 'no':>6}"
                         f"{r['prompt_tokens']:>8}{r['prefix_tokens']:>8}"
                         f"{r['computed_tokens']:>9}{r['ttft_s'] * 1e3:>10.1f}"
                         f"{r['full_ttft_s'] * 1e3:>10.1f}{r['speedup_vs_full']:>8.2f}x"
                         f"{r['cache_bytes'] / 2**20:>11.1f}{twin}")
        if any("vs_exact" in r for r in rows):
            lines.append("exact ms: an exact twin (full prefill, a prefix cache of its own) on "
                         "the same prompt after the same answers; vs exact: its TTFT over the "
                         "configuration's")
        lines.append("")
    return "\n".join(lines + verdicts(records))


def verdicts(records: list[dict], target: float = 10.0) -> list[str]:
    """Per workload: the exact configuration's lowest speedup over turns >= 2 against the
    target."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in records):
        later = [r["speedup_vs_full"] for r in records if r["workload"] == workload
                 and r.get("config") == "full+prefix-cache" and r["turn"] >= 2]
        if later:
            worst = min(later)
            out.append(f"{workload}: full+prefix-cache, turns >= 2: {worst:.1f}x lowest, "
                       f"{statistics.median(later):.1f}x median; target >= {target:.0f}x: "
                       f"{'PASS' if worst >= target else 'FAIL'}")
        twins = [r["vs_exact"] for r in records if r["workload"] == workload
                 and "vs_exact" in r and r["turn"] >= 2]
        if twins:
            worst = min(twins)
            out.append(f"{workload}: blend+prefix-cache against the exact path on its own "
                       f"prompts, turns >= 2: {worst:.2f}x lowest; target >= {EXACT_TARGET}x: "
                       f"{'PASS' if worst >= EXACT_TARGET else 'FAIL'}")
    return out
