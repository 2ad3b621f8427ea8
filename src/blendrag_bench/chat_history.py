"""A chat whose passages change every turn: the ``history`` workload of ``bench chat``.

Every turn sends what LlamaIndex's ``ContextChatEngine`` sends: a system message of its context
template around the passages retrieved for this turn, the conversation so far (the questions
and the model's own answers), the new question. The passages change every turn, so the prefix
cache stops at the system prompt; the history cache (engine/caches/history.py) takes the
conversation's rows from the turn before wherever they land.

One conversation, driven by the engine with history reuse (its answers are the conversation);
every turn's prompt also runs on an engine without history reuse (the same prefix cache
otherwise) and as a full prefill on an engine with no cache. Per turn: each TTFT, the history
tokens reused against the history in the prompt, and the whole answers: the answer with
history reuse against the one without it (same answer, answer KL with the answer without it as
the reference, teacher-forced) and against full prefill's.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from blendrag.config import BlendConfig
from blendrag.engine.engine import BlendEngine
from blendrag.eval.answer import answer_kl, forced_logits, greedy_answer, same_answer
from blendrag.integration.flat_prompt import find_layout
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.prompt import PromptLayout
from blendrag_bench.chat_config import FULL, ChatBenchConfig
from blendrag_bench.datasets import MUSIQUE_PATH, fit_tokens
from blendrag_bench.ttft import build_engine

if TYPE_CHECKING:
    from blendrag.engine.request.prefill import Prefill
    from blendrag.engine.request.stats import RequestStats
    from blendrag.eval.answer import Answer

CONTEXT_TEMPLATE = ("Use the context information below to assist the user.\n--------------------\n"
                    "{context_str}\n--------------------\n")
"""LlamaIndex's ``ContextChatEngine`` default context template (llama-index-core 0.12)."""
SEPARATOR = "\n\n"  # between two passages in the context (LlamaIndex's)
FOLLOW_UPS = ("When did that happen?", "Who else was involved?", "Where did it take place?",
              "Why does that matter?", "Can you say that again in one sentence?")


def run_history(cfg: ChatBenchConfig,
                on_turn: Callable[[str, int, int], None] | None = None) -> list[dict]:
    """One record per turn: ``cfg.runs`` conversations (the same greedy one each time, on new
    engines), each turn's median TTFTs."""
    kw = {"dtype": cfg.dtype, "device": cfg.device, "gguf_file": cfg.gguf_file, "threads": None}
    base = BlendEngine.from_pretrained(cfg.model or DEFAULT_MODEL, chunk_prefix="", **kw)
    runs = [_conversation(base, cfg, on_turn, r) for r in range(cfg.runs)]
    return [_median(rows) for rows in zip(*runs)]


def _conversation(base: BlendEngine, cfg: ChatBenchConfig,
                  on_turn: Callable[[str, int, int], None] | None, run: int) -> list[dict]:
    """One conversation of ``cfg.turns`` turns on new engines over ``base``'s model and
    store."""
    with_history = sibling(base, cfg.cache_bytes)
    without = sibling(base, cfg.cache_bytes, 0)
    plain = sibling(base, 0, 0)
    record = json.loads(MUSIQUE_PATH.read_text(encoding="utf-8"))[0]
    passages = _passages(base, record, cfg)
    index, config = ChunkTextIndex(), BlendConfig()
    # ingestion, not timed: the passages and the separator between two in the context
    base.ingest([*dict.fromkeys(p for turn in passages for p in turn), SEPARATOR])
    turns: list[dict[str, str]] = []
    records = []
    for t in range(cfg.turns):
        question = record["question"] if t == 0 else FOLLOW_UPS[(t - 1) % len(FOLLOW_UPS)]
        layout = _layout(base, index, passages[t], [*turns, {"role": "user", "content": question}])
        bare = _layout(base, index, passages[t], [{"role": "user", "content": question}])
        history = len(layout.suffix_ids) - len(bare.suffix_ids)
        ours = _answer(with_history, layout, config, cfg.answer_tokens)
        theirs = _answer(without, layout, config, cfg.answer_tokens)
        full = _answer(plain, layout, FULL, cfg.answer_tokens)
        kl = answer_kl(theirs[1].logits, forced_logits(with_history, ours[0], ours[1],
                                                       theirs[1].token_ids))
        records.append(_record(t + 1, layout, history, ours, theirs, full, kl))
        turns += [{"role": "user", "content": question},
                  {"role": "assistant", "content": ours[1].text}]
        if on_turn is not None:
            on_turn("history", run * cfg.turns + t + 1, cfg.runs * cfg.turns)
    return records


def _median(rows: tuple[dict, ...]) -> dict:
    """One turn over the runs: median TTFTs, the first run's counts and answers."""
    out = dict(rows[0])
    for key in ("ttft_s", "without_ttft_s", "full_ttft_s"):
        out[key] = statistics.median(r[key] for r in rows)
    return out


def run_random_history(cfg: ChatBenchConfig,
                       on_turn: Callable[[str, int, int], None] | None = None) -> list[dict]:
    """The same conversation on random weights of the ``bench ttft`` shape, token ids only:
    ``cfg.random.chunks`` new random chunks every turn ahead of the history (32-token
    questions, answers of ``cfg.answer_tokens`` fixed random ids decoded after the prefill,
    teacher-forced, so that their rows are the ones a generated answer leaves). TTFT only: a
    random model's answers say nothing."""
    w = cfg.random
    base = build_engine(w)
    plain = sibling(base, 0, 0)
    g = torch.Generator().manual_seed(w.seed)
    vocab = base.model.config.vocab_size

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prefix = ids(w.prefix_tokens)
    chunks = [[ids(w.chunk_tokens) for _ in range(w.chunks)] for _ in range(cfg.turns)]
    questions = [ids(w.suffix_tokens) for _ in range(cfg.turns)]
    answers = [ids(cfg.answer_tokens) for _ in range(cfg.turns)]
    base.precompute(prefix, [c for turn in chunks for c in turn])  # ingestion, not timed
    samples = []
    for run in range(cfg.runs):
        engines = [sibling(base, cfg.cache_bytes),
                   sibling(base, cfg.cache_bytes, 0)]
        records = []
        for t in range(cfg.turns):
            history = [x for i in range(t) for x in (*questions[i], *answers[i])]
            layout = PromptLayout(prefix, chunks[t], [*history, *questions[t]])
            stats = [teacher_forced(e, layout, BlendConfig(), answers[t]).stats
                     for e in engines]
            full = plain.prefill(layout, FULL).stats
            records.append(_ttft_record("random-history", t + 1, layout, len(history), *stats,
                                        full))
            if on_turn is not None:
                on_turn("random-history", run * cfg.turns + t + 1, cfg.runs * cfg.turns)
        samples.append(records)
    return [_median(rows) for rows in zip(*samples)]


def teacher_forced(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
                   answer: list[int]) -> Prefill:
    """A turn's prefill, then ``answer`` decoded after it (teacher-forced) and the rows kept, as
    a generated answer leaves them (its last token has no row)."""
    pre = engine.prefill(layout, config, extra_capacity=len(answer))
    for token in answer[:-1]:
        engine.runner.decode(token, pre.fused)
    engine.keep_rows([*layout.ids, *answer], pre)
    return pre


def sibling(base: BlendEngine, cache_bytes: int, history_bytes: int | None = None) -> BlendEngine:
    """An engine over ``base``'s model, store, context and prompt settings with caches of its
    own: a prefix cache of ``cache_bytes`` (0: none), a history cache of ``history_bytes``
    (None: the prefix cache's budget; 0: none)."""
    prompts = base.prompts
    return BlendEngine(base.model, base.tokenizer, store=base.store, context=base.context,
                       chat=prompts.chat if prompts else None,
                       chunk_prefix=prompts.chunk_prefix if prompts else None,
                       prefix_cache_bytes=cache_bytes, history_bytes=history_bytes,
                       threads=None)


def _passages(engine: BlendEngine, record: dict, cfg: ChatBenchConfig) -> list[list[str]]:
    """``cfg.turn_passages`` of the record's passages per turn, a new set each turn (round the
    record's passages again when they run out), each cut to ``cfg.passage_tokens``."""
    texts = [c["text"].strip() for c in record["ctxs"]]
    if cfg.passage_tokens is not None:
        texts = [fit_tokens(t, cfg.passage_tokens, lambda s: len(engine.prompts.encode(s)))
                 for t in texts]
    k = cfg.turn_passages
    return [[texts[(t * k + i) % len(texts)] for i in range(k)] for t in range(cfg.turns)]


def _layout(engine: BlendEngine, index: ChunkTextIndex, passages: list[str],
            messages: list[dict[str, str]]) -> PromptLayout:
    """The prompt a ContextChatEngine turn sends, cut at the passages as a framework LLM cuts
    it."""
    system = CONTEXT_TEMPLATE.format(context_str=SEPARATOR.join(passages))
    prompt = engine.prompts.render_chat([{"role": "system", "content": system}, *messages])
    flat = find_layout(engine.prompts, prompt, index, passages, templated=True)
    if flat.full_only:
        raise RuntimeError("the passages were not found in the chat prompt")
    return flat.layout


def _answer(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
            tokens: int) -> tuple[Prefill, Answer]:
    """(the prefill, its greedy answer): the answer's rows kept, as a chat turn keeps them."""
    pre = engine.prefill(layout, config, extra_capacity=tokens)
    answer = greedy_answer(engine, pre, tokens)
    engine.keep_rows([*layout.ids, *answer.token_ids], pre)
    return pre, answer


def _record(turn: int, layout: PromptLayout, history: int, ours: tuple, theirs: tuple,
            full: tuple, kl: float) -> dict:
    a, b, c = (x[1] for x in (ours, theirs, full))
    return {**_ttft_record("history", turn, layout, history, ours[0].stats, theirs[0].stats,
                           full[0].stats),
            "same_answer": same_answer(a.text, b.text), "same_as_full": same_answer(a.text, c.text),
            "without_same_as_full": same_answer(b.text, c.text), "answer_kl": kl,
            "answer": a.text, "answer_without": b.text, "answer_full": c.text}


def _ttft_record(workload: str, turn: int, layout: PromptLayout, history: int, s: RequestStats,
                 n: RequestStats, f: RequestStats) -> dict:
    """A turn's TTFT with history reuse (``s``), without (``n``) and of a full prefill (``f``)."""
    return {"workload": workload, "turn": turn, "prompt_tokens": layout.num_tokens,
            "history_tokens": history, "history_reused": s.cache.history_tokens,
            "prefix_tokens": s.cache.prefix_cache_tokens,
            "computed_tokens": s.compute.computed_per_layer[0] + s.compute.bridged_tokens,
            "computed_without": n.compute.computed_per_layer[0] + n.compute.bridged_tokens,
            "ttft_s": s.timing.ttft_s, "without_ttft_s": n.timing.ttft_s,
            "full_ttft_s": f.timing.ttft_s}


def format_history(records: list[dict], cfg: ChatBenchConfig, workload: str = "history") -> str:
    """The table of a history workload (``history`` or ``random-history``) and its verdicts."""
    rows = [r for r in records if r["workload"] == workload]
    answers = workload == "history"
    per_turn = (f"{cfg.turn_passages} new passages" if answers
                else f"{cfg.random.chunks} new chunks of {cfg.random.chunk_tokens} tokens")
    lines = [f"workload: {workload}; {cfg.turns} turns, {per_turn} each turn, answers of up to "
             f"{cfg.answer_tokens} tokens; ms are TTFT",
             f"{'turn':>4}{'prompt':>8}{'history':>8}{'reused':>8}{'computed':>9}"
             f"{'w/o':>6}{'history':>10}{'w/o hist':>10}{'full':>9}{'vs w/o':>8}"
             f"{'vs full':>8}" + (f"{'same':>6}{'= full':>7}{'KL':>9}" if answers else "")]
    for r in rows:
        line = (f"{r['turn']:>4}{r['prompt_tokens']:>8}{r['history_tokens']:>8}"
                f"{r['history_reused']:>8}{r['computed_tokens']:>9}"
                f"{r['computed_without']:>6}{r['ttft_s'] * 1e3:>10.1f}"
                f"{r['without_ttft_s'] * 1e3:>10.1f}{r['full_ttft_s'] * 1e3:>9.1f}"
                f"{r['without_ttft_s'] / r['ttft_s']:>7.2f}x"
                f"{r['full_ttft_s'] / r['ttft_s']:>7.2f}x")
        if answers:
            line += (f"{'yes' if r['same_answer'] else 'no':>6}"
                     f"{'yes' if r['same_as_full'] else 'no':>7}{r['answer_kl']:>9.4f}")
        lines.append(line)
    return "\n".join([*lines, "", *history_verdicts(rows)])


def history_verdicts(rows: list[dict]) -> list[str]:
    """Turns >= 2 against the targets: >= 2x lower TTFT than without history reuse, >= 3x
    lower than full prefill, >= 80 % of the history reused."""
    later = [r for r in rows if r["turn"] >= 2 and r["history_tokens"]]
    if not later:
        return []
    vs_without = min(r["without_ttft_s"] / r["ttft_s"] for r in later)
    vs_full = min(r["full_ttft_s"] / r["ttft_s"] for r in later)
    reused = min(r["history_reused"] / r["history_tokens"] for r in later)
    name = rows[0]["workload"]
    out = [f"{name}, turns >= 2: {vs_without:.2f}x lowest vs without history reuse (target "
           f">= 2x: {'PASS' if vs_without >= 2 else 'FAIL'}), {vs_full:.2f}x lowest vs full "
           f"(target >= 3x: {'PASS' if vs_full >= 3 else 'FAIL'}); history reused "
           f"{reused:.0%} at least (target >= 80 %: {'PASS' if reused >= 0.8 else 'FAIL'})"]
    if "same_answer" in rows[0]:
        same = sum(r["same_answer"] for r in rows)
        out.append(f"{name}, whole answers: {same} of {len(rows)} turns the same answer with "
                   f"history reuse as without it; answer KL median "
                   f"{statistics.median(r['answer_kl'] for r in rows):.4f}, max "
                   f"{max(r['answer_kl'] for r in rows):.4f}")
    return out
