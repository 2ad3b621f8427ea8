"""Answer-quality metrics (LongBench's) and first-token agreement with the full prefill.

- ``normalize_answer``: LongBench / SQuAD normalization: lowercase, drop ASCII punctuation,
  drop the articles a/an/the, collapse whitespace.
- ``qa_f1_score``: LongBench's ``qa_f1_score``: token-level F1 of the normalized prediction
  against each gold answer, the best over the golds.
- ``exact_match``: normalized equality with any gold answer.
- ``contains_answer``: a normalized gold answer occurs as whole words in the normalized
  prediction (instruct models answer in sentences).
- ``rouge_l_score``: ROUGE-L F1 (longest common subsequence of normalized tokens), for summaries.
- ``first_token_agrees`` / ``first_token_kl``: how a mode's first-token distribution compares
  with the full prefill's (argmax equality; KL(full || mode) of the softmax distributions).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the demo's corpus (and `blendrag --help`) needs no torch
    import torch

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """LongBench's normalization: lower, remove punctuation, remove articles, fix whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(answers: str | Sequence[str]) -> list[str]:
    golds = [answers] if isinstance(answers, str) else list(answers)
    if not golds:
        raise ValueError("at least one gold answer is needed")
    return golds


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the normalized whitespace tokens of ``prediction`` against one ``gold`` answer."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _f_measure(sum((Counter(pred) & Counter(ref)).values()), len(pred), len(ref))


def _f_measure(overlap: int, n_pred: int, n_ref: int) -> float:
    """Harmonic mean of overlap/n_pred and overlap/n_ref (0 without overlap)."""
    if overlap == 0:
        return 0.0
    precision, recall = overlap / n_pred, overlap / n_ref
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, answers: str | Sequence[str]) -> float:
    """LongBench ``qa_f1_score``: the best token F1 over the gold answers."""
    return max(token_f1(prediction, gold) for gold in _golds(answers))


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 when the normalized prediction equals a normalized gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in _golds(answers)))


def contains_answer(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 when a normalized gold answer occurs, as whole words, in the normalized prediction
    (an instruct model answers in a sentence: "Emil Ferreira was born in 1957.")."""
    pred = f" {normalize_answer(prediction)} "
    golds = [normalize_answer(gold) for gold in _golds(answers)]
    return float(any(f" {gold} " in pred for gold in golds if gold))


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (O(len(a) * len(b)) time, O(len(b)) memory)."""
    row = [0] * (len(b) + 1)
    for x in a:
        diag = 0
        for j, y in enumerate(b, start=1):
            diag, row[j] = row[j], diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F1 of the normalized whitespace tokens of ``prediction`` against one ``gold``."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _f_measure(_lcs_length(pred, ref) if pred and ref else 0, len(pred), len(ref))


def rouge_l_score(prediction: str, answers: str | Sequence[str]) -> float:
    """The best ROUGE-L F1 over the gold answers (summaries)."""
    return max(rouge_l(prediction, gold) for gold in _golds(answers))


METRICS: dict[str, Callable[[str, str | Sequence[str]], float]] = {
    "qa_f1": qa_f1_score,
    "rouge_l": rouge_l_score,
    "contains": contains_answer,
}
"""Quality metrics by name, as datasets name them (``EvalItem.metric``)."""


def score(metric: str, prediction: str, answers: str | Sequence[str]) -> float:
    """``METRICS[metric](prediction, answers)``; ValueError for an unknown metric."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {tuple(METRICS)}, got {metric!r}")
    return METRICS[metric](prediction, answers)


def first_token_agrees(reference_logits: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether the greedy first token (argmax of the logits [vocab]) is the same."""
    return int(reference_logits.argmax()) == int(logits.argmax())


def first_token_kl(reference_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(softmax(reference) || softmax(logits)) in nats, computed in float64.

    Tokens the reference gives no mass (logit -inf) contribute nothing; tokens the reference
    gives mass and the other distribution none make the divergence infinite.
    """
    if reference_logits.shape != logits.shape:
        raise ValueError(f"logits shapes differ: {tuple(reference_logits.shape)} vs "
                         f"{tuple(logits.shape)}")
    import torch

    log_p = torch.log_softmax(reference_logits.detach().double().cpu(), dim=-1)
    log_q = torch.log_softmax(logits.detach().double().cpu(), dim=-1)
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    return max(0.0, float(terms.sum()))


def speedup_words(speedup: float, than: str = "full prefill") -> str:
    """A TTFT ratio (``than``'s TTFT over this one's) in words that cannot be misread:
    "1.52x faster than full prefill", "0.84x: slower than full prefill", or "1.00x: as fast as
    full prefill" (what rounds to 1.00x: a full prefill itself, say)."""
    if f"{speedup:.2f}" == "1.00":
        return f"1.00x: as fast as {than}"
    if speedup >= 1.0:
        return f"{speedup:.2f}x faster than {than}"
    return f"{speedup:.2f}x: slower than {than}"
