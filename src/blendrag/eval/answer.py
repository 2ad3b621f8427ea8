"""Whole-answer fidelity: does a mode give full prefill's answer, not only its first token?

A user reads the whole answer. Two measures of a mode against full prefill on one prompt:

- **same answer**: the mode's own greedy answer, normalized (``normalize_answer``), equals full
  prefill's;
- **answer KL**: KL(full || mode) at every token of *full's* answer, both decoding full's tokens
  (teacher forcing), averaged over those tokens. It sees a drift before it flips a token, and it
  compares the two KVs on the same text even where the greedy answers part ways.

``greedy_answer`` decodes after a prefill and keeps the logits of every step; ``forced_logits``
then re-uses the rows the mode's own answer wrote for as long as it agrees with full's answer and
decodes full's tokens from there, so teacher forcing costs only the tokens after the first
difference. ``compare_answers`` does both for a list of configs on one prompt (the benchmark,
the demo and the real-model test use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from blendrag.config import BlendConfig
from blendrag.engine.request.stats import RequestStats
from blendrag.eval.metrics import first_token_agrees, first_token_kl, normalize_answer
from blendrag.prompt import PromptLayout

if TYPE_CHECKING:
    from blendrag.engine import BlendEngine, Prefill


@dataclass(frozen=True)
class Answer:
    """A greedy answer. token_ids: the tokens decoded, the EOS that ended it included;
    logits: [T, vocab] float32, row t the logits that predicted token_ids[t]; text: the decoded
    answer (its first line when decoding stopped there), stripped."""

    token_ids: tuple[int, ...]
    logits: torch.Tensor
    text: str


def greedy_answer(engine: BlendEngine, pre: Prefill, max_new_tokens: int,
                  first_line: bool = False) -> Answer:
    """Greedy decoding after ``pre`` (its buffer needs ``max_new_tokens`` spare rows): up to an
    EOS, ``max_new_tokens`` tokens or, with ``first_line``, the first line break after some
    text."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    logits, ids, rows = pre.logits, [], []
    while True:
        rows.append(logits)  # [vocab]
        token = int(logits.argmax())
        ids.append(token)
        if token in engine.eos_token_ids or len(ids) >= max_new_tokens or (
                first_line and "\n" in _text(engine, ids).lstrip()):
            break
        logits = engine.runner.decode(token, pre.fused)
    text = _text(engine, [t for t in ids if t not in engine.eos_token_ids])
    if first_line:
        text = text.lstrip().split("\n", 1)[0]
    return Answer(tuple(ids), torch.stack(rows), text.strip())


def _text(engine: BlendEngine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=True)


def forced_logits(engine: BlendEngine, pre: Prefill, own: Answer,
                  tokens: tuple[int, ...]) -> torch.Tensor:
    """[len(tokens), vocab] float32: the logits ``pre``'s KV gives each of ``tokens`` when the
    tokens before it are ``tokens`` (teacher forcing). ``own`` is the greedy answer already
    decoded from ``pre``: where it agrees with ``tokens`` its logits and rows are the forced
    ones, so decoding resumes after the first difference. It writes ``tokens``' rows into
    ``pre``'s buffer (the prompt's rows stay as they are): decode ``pre`` no further after it."""
    if not tokens:
        raise ValueError("teacher forcing needs at least one token")
    same = 0
    while same < min(len(own.token_ids), len(tokens)) and own.token_ids[same] == tokens[same]:
        same += 1
    # own.logits[t] was computed after own.token_ids[:t]: the forced logits for t <= same
    known = min(same + 1, len(own.token_ids), len(tokens))
    rows = list(own.logits[:known])
    start = pre.stats.prompt.tokens
    # rows start .. start+known-2 hold tokens[:known-1] (own's decode wrote them); go on from there
    pre.fused.length = start + known - 1
    for t in range(known, len(tokens)):
        rows.append(engine.runner.decode(tokens[t - 1], pre.fused))
    return torch.stack(rows)


def answer_kl(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over positions of KL(softmax(reference[t]) || softmax(logits[t])), in nats, float64;
    reference, logits: [T, vocab]."""
    if reference.shape != logits.shape or reference.dim() != 2 or not len(reference):
        raise ValueError(f"expected two [T, vocab] logits of one shape with T >= 1, got "
                         f"{tuple(reference.shape)} and {tuple(logits.shape)}")
    log_p = torch.log_softmax(reference.double(), dim=-1)
    log_q = torch.log_softmax(logits.double(), dim=-1)
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))  # [T, vocab]
    return float(terms.sum(dim=-1).clamp_min(0).mean())


def same_answer(answer: str, reference: str) -> bool:
    """Whether two answers are the same text once normalized (case, punctuation, articles,
    whitespace)."""
    return normalize_answer(answer) == normalize_answer(reference)


@dataclass(frozen=True)
class Comparison:
    """One config's answer against the reference config's (full prefill's) on one prompt."""

    config: BlendConfig
    answer: Answer
    same_answer: bool
    answer_kl: float  # 0.0 for the reference itself
    first_token_agrees: bool
    first_token_kl: float
    stats: RequestStats


def compare_answers(engine: BlendEngine, layout: PromptLayout, configs: Sequence[BlendConfig],
                    max_new_tokens: int, first_line: bool = False) -> list[Comparison]:
    """Prefill ``layout`` with each config in turn and decode its greedy answer; the first
    config (full prefill, normally) is the reference every other one is compared with."""
    if not configs:
        raise ValueError("compare_answers needs at least the reference config")
    out: list[Comparison] = []
    reference: Answer | None = None
    for config in configs:
        # in its own mode (``as_asked``): a full prefill the loading config would choose
        # instead (a GPU's cost profile, chunks missing) would make a blend's row measure it
        pre = engine.prefill(layout, config, extra_capacity=max_new_tokens, as_asked=True)
        if pre.stats.mode != config.mode:  # a comparison of what was not asked: refused
            raise RuntimeError(f"asked for {config.label}, the engine ran {pre.stats.mode}")
        own = greedy_answer(engine, pre, max_new_tokens, first_line)
        ref = own if reference is None else reference
        kl = 0.0 if reference is None else answer_kl(
            ref.logits, forced_logits(engine, pre, own, ref.token_ids))
        out.append(Comparison(config, own, same_answer(own.text, ref.text), kl,
                              first_token_agrees(ref.logits[0], pre.logits),
                              first_token_kl(ref.logits[0], pre.logits), pre.stats))
        reference = ref
        del pre  # its buffer back to the pool: every config prefills in the pooled buffer
    return out
