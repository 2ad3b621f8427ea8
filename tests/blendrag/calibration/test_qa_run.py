"""Calibrating on labelled questions on a tiny model (``blendrag.calibration.qa_run``): each
answer scored against the gold answers, the frontier's quality and paired bound, the choice
and its record, progress kept question by question and the time budget."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine
from blendrag.calibration.qa_file import QAItem
from blendrag.calibration.qa_run import SavedQuestions, Scored, calibrate_qa, quality_frontier
from blendrag.calibration.quality import QualityTarget
from helpers.tiny import PASSAGES

ITEMS = [QAItem(f"Which passage mentions item {i}?", (f"zqx{i}",),
                (PASSAGES[i % 4], PASSAGES[(i + 1) % 4])) for i in range(10)]


@pytest.fixture(scope="module")
def engine(model_dir) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chunk_prefix="")


def test_the_frontier_has_each_ratios_mean_quality_and_paired_bound():
    def row(full: float, blend: float) -> list[Scored]:
        return [Scored(None, None, full, True, 0.0, 2.0),
                Scored("preview", 0.3, blend, full == blend, 0.01, 1.0)]
    rows = [row(1, 1)] * 6 + [row(0, 0)] * 2 + [row(1, 0), row(0, 1)]
    (point,) = quality_frontier(rows, 0.9)
    assert (point.selector, point.ratio, point.prompts) == ("preview", 0.3, 10)
    assert point.quality == pytest.approx(0.7) and point.same_answer == pytest.approx(0.8)
    assert point.speedup == pytest.approx(2.0) and point.answer_kl == pytest.approx(0.01)
    # mean difference 0, sd sqrt(2/9), t(0.9, 9) 1.383: 0 - 1.383 * 0.4714 / sqrt(10)
    assert point.quality_bound == pytest.approx(-0.2062, abs=1e-3)
    (few,) = quality_frontier(rows[:9], 0.9)  # under MIN_QUESTIONS: no bound
    assert few.quality_bound is None and few.prompts == 9


def test_calibrating_scores_answers_and_records_the_target_it_met(engine):
    # a random model names none of the gold answers: every quality 0, full's too, so every
    # ratio is within a margin of 0 and the smallest is chosen
    record = calibrate_qa(engine, ITEMS, QualityTarget(margin=0.0, answer_tokens=4),
                          corpus="c" * 64, ratios=(0.2, 0.5, 1.0))
    assert (record.selector, record.ratio, record.prompts) == ("preview", 0.2, 10)
    assert record.target == {"kind": "answer_quality", "margin": 0.0, "confidence": 0.9,
                             "metric": "contains", "answer_tokens": 4, "questions": 10,
                             "full_quality": 0.0, "quality": 0.0, "bound": 0.0}
    assert [(p.ratio, p.quality, p.quality_bound) for p in record.frontier] == [
        (0.2, 0.0, 0.0), (0.5, 0.0, 0.0), (1.0, 0.0, 0.0)]
    assert record.frontier[-1].same_answer == 1.0  # ratio 1.0: full's rows, not measured
    assert record.flow.startswith("flow `engine`") and record.corpus == "c" * 64


def test_a_few_questions_give_no_bound_and_only_the_full_prefill(engine):
    record = calibrate_qa(engine, ITEMS[:3], QualityTarget(margin=0.5, answer_tokens=3),
                          corpus="c" * 64, ratios=(0.2, 1.0))
    assert record.ratio == 1.0 and record.frontier[0].quality_bound is None
    none = calibrate_qa(engine, ITEMS[:3], QualityTarget(margin=0.5, answer_tokens=3),
                        corpus="c" * 64, ratios=(0.2,))
    assert none.ratio is None and none.target["quality"] is None


def test_a_stopped_calibration_goes_on_from_its_saved_questions(engine, tmp_path):
    target = QualityTarget(margin=0.0, answer_tokens=3)
    kept: list[SavedQuestions] = []

    def saved(settings: dict) -> SavedQuestions:
        kept.append(SavedQuestions(tmp_path, settings))
        return kept[-1]

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt  # the user's Ctrl-C, a kill
    with pytest.raises(KeyboardInterrupt):
        calibrate_qa(engine, ITEMS[:4], target, corpus="c" * 64, ratios=(0.3,),
                     on_question=stop_after_two, saved=saved)
    assert len(kept[0].load()) == 2 and kept[0].path.parent.name == "calibration-progress"
    seen: list[int] = []
    again = calibrate_qa(engine, ITEMS[:4], target, corpus="c" * 64, ratios=(0.3,),
                         on_question=lambda done, total: seen.append(done), saved=saved)
    assert seen == [3, 4] and again.prompts == 4  # questions 1 and 2 not measured again
    other = SavedQuestions(tmp_path, {**kept[0].settings, "metric": "qa_f1"})
    assert other.load() == []  # another measure: nothing to go on from


def test_a_saved_line_that_is_not_a_scored_row_ends_the_saved_part(tmp_path):
    saved = SavedQuestions(tmp_path, {"kind": "answer_quality"})
    good = [Scored(None, None, 1.0, True, 0.0, 0.5), Scored("preview", 0.3, 0.0, False, 0.1, 0.2)]
    saved.start([good])
    for bad in ([Scored(None, None, 1.5, True, 0.0, 0.5)],  # a quality above 1
                [Scored("preview", 0.3, 0.5, True, 0.0, 0.5)]):  # full prefill's row missing
        saved.add(1, bad)
    assert saved.load() == [good]


def test_the_budget_cuts_the_questions(engine):
    record = calibrate_qa(engine, ITEMS, QualityTarget(answer_tokens=3), corpus="c" * 64,
                          ratios=(0.3,), budget_s=1e-6)
    assert record.prompts == 1 and record.target["questions"] == 1
