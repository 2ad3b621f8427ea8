"""Evaluation datasets as RAG prompts: prefix, formatted chunks, suffix, gold answers.

Three sources, each with ``limit`` / ``offset``:

- ``load_synthetic``: the demo corpus's held-out questions (``blendrag_demo.corpus``), in the
  demo model's own prompt format.
- ``load_cacheblend_json``: a JSON list in the CacheBlend authors' format (``question``,
  ``answers``, ``ctxs[{title, text}]``) with their prompt.
- ``load_musique``: the shipped ``data/musique_s.json`` (MuSiQue, CC BY 4.0) in the CacheBlend
  paper's shape: 6 of each question's 10 passages, the ones holding a gold answer included.
- ``load_longbench_jsonl``: a LongBench JSONL file (``input``, ``context``, ``answers``): the
  context is cut at passage / paragraph boundaries into chunks of bounded size, with
  LongBench's multi-document QA prompt.

``load_dataset("synthetic" | "musique" | path)`` picks one by name or file extension.
``fit_tokens`` cuts a chunk to a token budget (the paper's 512 tokens per passage).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blendrag.eval.metrics import METRICS


@dataclass(frozen=True)
class EvalItem:
    """One question as a RAG prompt ``prefix + chunks + suffix`` (chunks already formatted).

    ``kind``: a group for per-kind breakdowns (synthetic: the question kind; files: the
    dataset name). ``metric``: the quality metric's name in ``blendrag.eval.metrics.METRICS``.
    ``answers``: the gold answers; empty for a prompt without any (a fidelity check on your own
    prompts compares with full prefill's answer only; quality is then NaN).
    """

    prefix: str
    chunks: tuple[str, ...]
    suffix: str
    answers: tuple[str, ...]
    kind: str
    metric: str = "qa_f1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(self.chunks))
        object.__setattr__(self, "answers", tuple(self.answers))
        if not self.chunks or any(not isinstance(c, str) or not c for c in self.chunks):
            raise ValueError("chunks must be a non-empty sequence of non-empty strings")
        if not self.suffix:
            raise ValueError("suffix must be non-empty")
        if any(not isinstance(a, str) for a in self.answers):
            raise ValueError("answers must be a sequence of strings")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {tuple(METRICS)}, got {self.metric!r}")


def _window(limit: int | None, offset: int) -> slice:
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return slice(offset, None if limit is None else offset + limit)


# --------------------------------------------------------------------------- synthetic

SYNTHETIC_DEFAULT_LIMIT = 100
"""Held-out questions drawn by ``load_synthetic`` when no ``limit`` is given."""


def load_synthetic(limit: int | None = None, offset: int = 0, seed: int | None = None,
                   num_chunks: int | tuple[int, int] = (4, 6)) -> list[EvalItem]:
    """Held-out demo-corpus questions ``offset .. offset + limit`` (default seed
    ``HELDOUT_SEED``)."""
    from blendrag_demo.corpus import (
        HELDOUT_SEED,
        PREFIX,
        format_chunk,
        format_suffix,
        generate_examples,
    )

    window = _window(SYNTHETIC_DEFAULT_LIMIT if limit is None else limit, offset)
    examples = generate_examples(window.stop, HELDOUT_SEED if seed is None else seed,
                                 num_chunks=num_chunks)
    return [EvalItem(PREFIX, tuple(format_chunk(c) for c in ex.chunks), format_suffix(ex.question),
                     tuple(ex.answers), ex.kind, metric="contains") for ex in examples[window]]


# --------------------------------------------------------------------------- CacheBlend JSON

CACHEBLEND_PREFIX = ("You will be asked a question after reading several passages. Please directly "
                     "answer the "
                     "question based on the given passages. Do NOT repeat the question. The answer "
                     "should be within 5 words.\nPassages:\n")
CACHEBLEND_PASSAGE = "{title}\n\n{text}\n\n"
CACHEBLEND_SUFFIX = ("\n\nAnswer the question directly based on the given passages. Do NOT repeat "
                     "the question. "
                     "The answer should be within 5 words. \nQuestion:{question}\nAnswer:")


def cacheblend_item(record: dict[str, Any], kind: str = "cacheblend") -> EvalItem:
    """One record ``{question, answers, ctxs: [{title, text}]}`` with the authors' prompt."""
    try:
        chunks = tuple(CACHEBLEND_PASSAGE.format(title=c.get("title", ""),
                                                 text=c["text"]) for c in record["ctxs"])
        answers = record["answers"]
        return EvalItem(CACHEBLEND_PREFIX, chunks,
                        CACHEBLEND_SUFFIX.format(question=record["question"]),
                        tuple([answers] if isinstance(answers, str) else answers), kind)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a CacheBlend record (question, answers, ctxs[{{title, text}}]): "
                         f"{e!r}") from e


def load_cacheblend_json(path: str | Path, limit: int | None = None,
                         offset: int = 0) -> list[EvalItem]:
    """Items of a CacheBlend-format JSON list; ``kind`` is the file's stem (e.g. ``musique_s``)."""
    path = Path(path)
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of records")
    return [cacheblend_item(r, kind=path.stem) for r in records[_window(limit, offset)]]


# --------------------------------------------------------------------------- MuSiQue (shipped)

MUSIQUE_PASSAGES = 6
MUSIQUE_PATH = Path(__file__).resolve().parent / "data" / "musique_s.json"


def select_passages(record: dict[str, Any], answers: Sequence[str],
                    k: int = MUSIQUE_PASSAGES) -> list[dict]:
    """``k`` of a record's passages: every one whose text holds a gold answer first (the
    supporting ones, as far as the text shows), then the others in retrieval order; the chosen
    ones keep their retrieval order."""
    ctxs = record["ctxs"]
    golds = [a.lower() for a in answers if a.strip()]
    holding = [i for i, c in enumerate(ctxs) if any(g in c["text"].lower() for g in golds)]
    rest = [i for i in range(len(ctxs)) if i not in holding]
    return [ctxs[i] for i in sorted((holding + rest)[:k])]


def load_musique(limit: int | None = None, offset: int = 0, passages: int = MUSIQUE_PASSAGES,
                 path: str | Path | None = None) -> list[EvalItem]:
    """MuSiQue questions ``offset .. offset + limit`` with ``passages`` passages each, in the
    CacheBlend prompt; kind ``musique``, scored by QA F1."""
    if passages < 1:
        raise ValueError(f"passages must be >= 1, got {passages}")
    records = json.loads(Path(path or MUSIQUE_PATH).read_text(encoding="utf-8"))
    items = []
    for r in records[_window(limit, offset)]:
        answers = [r["answers"]] if isinstance(r["answers"], str) else r["answers"]
        items.append(cacheblend_item({**r, "ctxs": select_passages(r, answers, passages)},
                                     kind="musique"))
    return items


def fit_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """``text`` cut after a word so that ``count(text) <= max_tokens``, keeping its trailing
    whitespace (a passage's separator); unchanged when it fits."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if count(text) <= max_tokens:
        return text
    body = text.rstrip()
    tail = text[len(body):]
    words = body.split(" ")
    lo, hi = 0, len(words)  # largest word count that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + tail) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        raise ValueError(f"no word of the text fits in {max_tokens} tokens: {text[:60]!r}")
    return " ".join(words[:lo]) + tail


# --------------------------------------------------------------------------- LongBench JSONL

LONGBENCH_INSTRUCTION = ("Answer the question based on the given passages. "
                         "Only give me the answer and do not output any other words.")
LONGBENCH_PREFIX = LONGBENCH_INSTRUCTION + "\n\nThe following are given passages.\n"
LONGBENCH_SUFFIX = "\n\n" + LONGBENCH_INSTRUCTION + "\n\nQuestion: {question}\nAnswer:"
SUMMARY_DATASETS = frozenset({"gov_report", "qmsum", "multi_news", "vcsum", "samsum"})
"""LongBench datasets scored with ROUGE-L instead of QA F1."""

_PASSAGE_START = re.compile(r"^Passage \d+:", re.MULTILINE)
_PARAGRAPH_END = re.compile(r"\n\s*\n")
_LINE_END = re.compile(r"\n")
_SPACE = re.compile(r"\s+")


def _cut_points(text: str) -> list[int]:
    """Offsets where a piece may start: LongBench's "Passage N:" headers, else blank lines,
    else line breaks (the first kind found in ``text``)."""
    starts = [m.start() for m in _PASSAGE_START.finditer(text)]
    if not starts:
        starts = [m.end() for m in _PARAGRAPH_END.finditer(text)] or [
            m.end() for m in _LINE_END.finditer(text)
        ]
    return sorted({0, *(s for s in starts if 0 < s < len(text))})


def _split_long(piece: str, max_chars: int) -> list[str]:
    """Cut a piece longer than ``max_chars`` after whitespace (hard cut inside a long word)."""
    out = []
    while len(piece) > max_chars:
        cuts = [m.end() for m in _SPACE.finditer(piece, 0, max_chars) if 0 < m.end() <= max_chars]
        cut = cuts[-1] if cuts else max_chars
        out.append(piece[:cut])
        piece = piece[cut:]
    return out + ([piece] if piece else [])


def split_context(text: str, max_chars: int = 2000) -> list[str]:
    """Chunks of ``text`` of at most ``max_chars`` characters, cut at passage / paragraph / line
    boundaries where possible; consecutive pieces are packed together while they fit.
    ``"".join(split_context(text)) == text``."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    points = _cut_points(text) + [len(text)]
    pieces = [p for a, b in zip(points, points[1:]) for p in _split_long(text[a:b], max_chars)]
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + len(piece) <= max_chars:
            chunks[-1] += piece
        else:
            chunks.append(piece)
    return chunks


def longbench_item(record: dict[str, Any], max_chars: int = 2000,
                   kind: str | None = None) -> EvalItem:
    """One LongBench record ``{input, context, answers[, dataset]}`` as a chunked prompt."""
    try:
        name = kind or record.get("dataset") or "longbench"
        answers = record["answers"]
        return EvalItem(LONGBENCH_PREFIX, tuple(split_context(record["context"], max_chars)),
                        LONGBENCH_SUFFIX.format(question=record["input"]),
                        tuple([answers] if isinstance(answers, str) else answers), name,
                        metric="rouge_l" if name in SUMMARY_DATASETS else "qa_f1")
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a LongBench record (input, context, answers): {e!r}") from e


def load_longbench_jsonl(path: str | Path, limit: int | None = None, offset: int = 0,
                         max_chars: int = 2000) -> list[EvalItem]:
    """Items of a LongBench JSONL file (one record per line; blank lines skipped)."""
    window = _window(limit, offset)
    items: list[EvalItem] = []
    with Path(path).open(encoding="utf-8") as f:
        lines = (line for line in f if line.strip())
        for i, line in enumerate(lines):
            if window.stop is not None and i >= window.stop:
                break
            if i >= window.start:
                items.append(longbench_item(json.loads(line), max_chars))
    return items


def kinds(items: Sequence[EvalItem]) -> list[str]:
    """The items' kinds in first-seen order."""
    return list(dict.fromkeys(item.kind for item in items))
