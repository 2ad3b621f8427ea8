"""Calibrate on answer quality: labelled questions (``qa_file.py``) answered with full prefill
and with blend at every ratio, as the application runs them (``flows.py``), each answer
scored against the gold answers with ``blendrag bench quality``'s measure; the smallest ratio
whose mean quality stays within the margin of full prefill's at its confidence bound is
chosen (``quality.py``).

Every ratio runs on every question (a t bound can recover from a bad start: none is dropped
early), ratio 1.0 excepted (a full prefill's rows: exact, not measured). Questions run in the
file's order; the time budget cuts the list at the pace measured so far, and progress is kept
question by question (``SavedQuestions``): the same command run again goes on from it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blendrag.calibration.flows import Flow, flow_settings, make_flow
from blendrag.calibration.plan import EXACT, fitting
from blendrag.calibration.prompts import CalibrationPrompt
from blendrag.calibration.qa_file import QAItem, qa_texts
from blendrag.calibration.quality import (
    MIN_QUESTIONS,
    QualityTarget,
    choose_quality,
    paired_bound,
)
from blendrag.calibration.run import FULL, INSTRUCTION, check_grid, fitted, parts_of
from blendrag.calibration.saved import SavedRows, held, is_amount, is_config
from blendrag.config import BlendConfig
from blendrag.engine.engine import BlendEngine
from blendrag.eval.answer import compare_answers
from blendrag.eval.metrics import score
from blendrag.store.calibration import CalibrationRecord, FrontierPoint, corpus_id


@dataclass(frozen=True)
class Scored:
    """One config's answer to one question (full prefill's: selector and ratio None): its
    quality against the gold answers, whether it is full prefill's answer, its answer KL
    against full's, its TTFT."""

    selector: str | None
    ratio: float | None
    quality: float
    same_answer: bool
    answer_kl: float
    ttft_s: float


class SavedQuestions(SavedRows[Scored]):
    """A calibration on labelled questions, saved question by question (``saved.py``)."""

    def dump(self, result: Scored) -> list:
        r = result
        return [r.selector, r.ratio, r.quality, r.same_answer, r.answer_kl, r.ttft_s]

    def parse(self, item: object) -> Scored | None:
        if not (isinstance(item, list) and len(item) == 6):
            return None
        selector, ratio, quality, same, kl, ttft = item
        if not (is_amount(quality) and quality <= 1 and isinstance(same, bool)
                and is_amount(kl) and is_amount(ttft) and is_config(selector, ratio)):
            return None
        return Scored(selector, None if ratio is None else float(ratio), float(quality), same,
                      float(kl), float(ttft))


def calibrate_qa(engine: BlendEngine, items: Sequence[QAItem], target: QualityTarget, *,
                 corpus: str, ratios: Sequence[float], selectors: Sequence[str] = ("preview",),
                 flow: str = "engine", instruction: str = INSTRUCTION,
                 on_question: Callable[[int, int], None] | None = None,
                 budget_s: float | None = None,
                 saved: Callable[[dict], SavedQuestions] | None = None) -> CalibrationRecord:
    """The calibration of ``engine`` on the labelled questions ``items`` (module docstring),
    recorded against ``corpus`` (the id of the passages it is for). ``on_question(done,
    total)`` after each question; ``budget_s``: seconds the measuring may take; ``saved(
    settings)``: where progress is kept and taken up again (the caller removes it once the
    record is kept)."""
    check_grid(ratios, selectors)
    if not items:
        raise ValueError("a calibration on answer quality needs at least one question")
    t0 = time.perf_counter()
    runs = make_flow(flow, engine, profile="profile" in selectors)
    progress = None if saved is None else saved(
        {"kind": "answer_quality", "model": engine.model_fp, "tokenizer": engine.tokenizer_fp,
         "questions": corpus_id(qa_texts(items)), "instruction": instruction,
         **flow_settings(runs, engine), "selectors": list(selectors), "ratios": list(ratios),
         "metric": target.metric, "answer_tokens": target.answer_tokens})
    configs = [FULL] + [BlendConfig(selector=s, ratio=r) for s in selectors for r in ratios
                        if r < EXACT]
    with held(progress):
        rows = score_questions(engine, runs, items, configs, target, instruction, budget_s,
                               on_question, progress)
    points = quality_frontier(rows, target.confidence)
    full_quality = statistics.mean(row[0].quality for row in rows)
    if EXACT in ratios:  # a full prefill's rows: its answers, its quality, exact
        points += [FrontierPoint(s, EXACT, 1.0, 0.0, 1.0, len(rows), full_quality, 0.0)
                   for s in selectors]
    chosen = choose_quality(points, target)
    return CalibrationRecord(
        model=engine.model_fp, tokenizer=engine.tokenizer_fp, corpus=corpus,
        selector=selectors[0] if chosen is None else chosen.selector,
        ratio=None if chosen is None else chosen.ratio,
        target=target.record(len(rows), full_quality, chosen), frontier=tuple(points),
        flow=runs.describe(), prompts=len(rows), seconds=time.perf_counter() - t0)


def score_questions(engine: BlendEngine, runs: Flow, items: Sequence[QAItem],
                    configs: Sequence[BlendConfig], target: QualityTarget, instruction: str,
                    budget_s: float | None, on_question: Callable[[int, int], None] | None,
                    progress: SavedQuestions | None) -> list[list[Scored]]:
    """Per question, each config's ``Scored`` (full prefill's first): the questions saved by
    an earlier run first, then new ones while the budget allows."""
    expected = [_key(c) for c in configs]
    rows: list[list[Scored]] = []
    for row in [] if progress is None else progress.load()[:len(items)]:
        if [(r.selector, r.ratio) for r in row] != expected:
            break  # saved under other configs: measured again from here
        rows.append(row)
    if progress is not None:
        progress.start(rows)
    saved, started, planned = len(rows), time.perf_counter(), len(items)
    while len(rows) < planned:
        i = len(rows)
        rows.append(score_one(engine, runs, items[i], configs, target, instruction, i))
        if progress is not None:
            progress.add(i, rows[-1])
        # the pace of this run's questions only: the saved ones cost nothing now
        planned = saved + fitting(len(items) - saved, len(rows) - saved, started, budget_s)
        if on_question is not None:
            on_question(len(rows), planned)
    return rows


def score_one(engine: BlendEngine, runs: Flow, item: QAItem, configs: Sequence[BlendConfig],
              target: QualityTarget, instruction: str, index: int) -> list[Scored]:
    """Question ``index`` answered by each of ``configs`` and scored (a prompt too long for the
    model loses its last passages, as a calibration prompt does)."""
    parts = parts_of(CalibrationPrompt(item.passages, item.question), instruction)
    parts, layout = fitted(engine, runs, parts, target.answer_tokens)
    runs.ingest(index, parts, layout)
    # as `bench quality`: an F1-scored answer ends at its first line
    results = compare_answers(engine, layout, configs, target.answer_tokens,
                              first_line=target.metric == "qa_f1")
    return [Scored(*_key(r.config), score(target.metric, r.answer.text, item.answers),
                   r.same_answer, r.answer_kl, r.stats.timing.ttft_s) for r in results]


def _key(config: BlendConfig) -> tuple[str | None, float | None]:
    blend = config.mode == "blend"
    return (config.selector if blend else None, float(config.ratio) if blend else None)


def quality_frontier(rows: Sequence[Sequence[Scored]], confidence: float,
                     ) -> list[FrontierPoint]:
    """Per (selector, ratio) over the questions: the mean quality, the lower ``confidence``
    bound of its paired difference from full prefill's (None under ``MIN_QUESTIONS``
    questions), the share of full's answers, the mean answer KL and full's mean TTFT over
    its mean TTFT."""
    full = [row[0] for row in rows]
    points = []
    for j in range(1, len(rows[0]) if rows else 0):
        own = [row[j] for row in rows]
        bound = (paired_bound([f.quality for f in full], [o.quality for o in own], confidence)
                 if len(rows) >= MIN_QUESTIONS else None)
        speedup = statistics.mean(f.ttft_s for f in full) / statistics.mean(
            o.ttft_s for o in own)
        points.append(FrontierPoint(
            str(own[0].selector), float(own[0].ratio or 0.0),
            statistics.mean(float(o.same_answer) for o in own),
            statistics.mean(o.answer_kl for o in own),
            speedup if math.isfinite(speedup) else 0.0, len(rows),
            statistics.mean(o.quality for o in own), bound))
    return points
