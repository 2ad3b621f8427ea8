"""Calibrating on a tiny model: prompts from the passages, the frontier measured against full
prefill through the application's own flow, the cheapest ratio meeting the target chosen, and
the choice checked on the other half of a corpus (``blendrag.calibration``)."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine
from blendrag.calibration.prompts import GENERIC, make_prompts, split_half
from blendrag.calibration.run import calibrate, choose, holdout
from blendrag.calibration.target import CalibrationTarget, lower_bound
from blendrag.store.calibration import FrontierPoint, corpus_id
from helpers.tiny import PASSAGES

CORPUS = [*PASSAGES, "She lives in Berlin and works as an engineer at a small company. ",
          "Numbers 0123456789 and punctuation follow the quick brown fox. "]


@pytest.fixture(scope="module")
def engine(model_dir) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chunk_prefix="")


def test_prompts_are_drawn_from_the_passages_with_generic_questions():
    made = make_prompts(CORPUS, 10, per_prompt=3, seed=4)
    assert len(made) == 10 and all(len(set(p.passages)) == 3 for p in made)
    assert all(set(p.passages) <= set(CORPUS) for p in made)
    assert [p.question for p in made[:len(GENERIC)]] == list(GENERIC)[:10]
    assert make_prompts(CORPUS, 10, 3, seed=4) == made  # seeded
    with pytest.raises(ValueError, match="at least 4 passages"):
        make_prompts(CORPUS[:3], 2, per_prompt=4)
    a, b = split_half(CORPUS)
    assert sorted(a + b) == sorted(CORPUS) and abs(len(a) - len(b)) <= 1


def test_the_cheapest_ratio_meeting_the_target_is_chosen():
    target = CalibrationTarget(same_answer=0.9, answer_kl=0.02)
    points = [FrontierPoint("preview", 0.1, 0.80, 0.010, 5.0),
              FrontierPoint("preview", 0.3, 0.92, 0.015, 3.0),
              FrontierPoint("preview", 0.5, 0.95, 0.005, 2.0),
              FrontierPoint("epic", 0.2, 0.91, 0.019, 3.5),
              FrontierPoint("epic", 0.3, 1.00, 0.001, 2.9)]
    assert choose(points, target) == ("epic", 0.2)  # faster than preview's 0.3
    assert choose(points, CalibrationTarget(same_answer=0.94, answer_kl=None)) == ("epic", 0.3)
    assert choose(points, CalibrationTarget(same_answer=None, answer_kl=0.012)) == ("preview", 0.1)
    assert choose(points, CalibrationTarget(same_answer=1.0, answer_kl=0.0)) == ("preview", None)
    with pytest.raises(ValueError, match="same_answer, answer_kl or both"):
        CalibrationTarget(None, None)


def test_a_share_over_few_prompts_counts_at_its_lower_bound():
    """23 of 24 answers the same (0.96) is not a claim of 0.9 on unseen prompts: its one-sided
    90 % Wilson bound is 0.87 (longfacts: chosen at 0.96, held out at 0.75); 24 of 24 is
    (0.94), and a full recompute is exact whatever the count."""
    assert lower_bound(23 / 24, 24) == pytest.approx(0.870, abs=1e-3)
    assert lower_bound(1.0, 24) == pytest.approx(0.936, abs=1e-3)
    assert lower_bound(0.96, 400) > 0.94  # more prompts, a tighter bound
    target = CalibrationTarget(same_answer=0.9, answer_kl=0.02)
    points = [FrontierPoint("preview", 0.7, 23 / 24, 0.0001, 1.3, prompts=24),
              FrontierPoint("preview", 1.0, 1.0, 0.0, 0.97, prompts=24)]
    assert choose(points, target) == ("preview", 1.0)
    unknown = [FrontierPoint("preview", 0.7, 23 / 24, 0.0001, 1.3)]  # count not recorded
    assert choose(unknown, target) == ("preview", 0.7)
    few = [FrontierPoint("preview", 1.0, 1.0, 0.0, 0.97, prompts=3)]
    assert choose(few, target) == ("preview", 1.0)  # exact by construction
    with pytest.raises(ValueError, match="at least one item"):
        lower_bound(1.0, 0)


@pytest.mark.parametrize("flow", ["integration", "engine"])
def test_calibrating_measures_blend_against_full_and_records_what_ran(engine, flow):
    # blend at 1.0 is a full prefill: an answer KL bound only it meets
    strict = CalibrationTarget(same_answer=1.0, answer_kl=1e-8, answer_tokens=8)
    record = calibrate(engine, CORPUS, strict, prompts=4, per_prompt=3, ratios=(0.2, 1.0),
                       flow=flow)
    assert (record.selector, record.ratio) == ("preview", 1.0)
    assert (record.model, record.tokenizer) == (engine.model_fp, engine.tokenizer_fp)
    assert record.corpus == corpus_id(CORPUS) and record.prompts == 4
    one = record.point()
    assert one is not None and one.same_answer == 1.0 and one.answer_kl < 1e-8
    low = next(p for p in record.frontier if p.ratio == 0.2)
    assert low.answer_kl > 1e-6  # the partial blend really differs
    assert f"flow `{flow}`" in record.flow and "chunk prefix ''" in record.flow
    assert record.seconds > 0 and record.target["answer_tokens"] == 8


def test_the_choice_is_checked_on_the_other_half_of_the_corpus(engine):
    first, second = split_half([*CORPUS, *CORPUS[:2]], seed=3)
    target = CalibrationTarget(same_answer=None, answer_kl=1.0, answer_tokens=6)
    record = calibrate(engine, first, target, prompts=3, per_prompt=2, ratios=(0.3, 1.0))
    assert record.ratio == 0.3  # a loose target: the smallest ratio
    held = holdout(engine, second, record, target, prompts=3, per_prompt=2)
    assert held is not None and (held.selector, held.ratio) == ("preview", 0.3)
    assert 0.0 <= held.same_answer <= 1.0 and held.answer_kl >= 0.0


def test_model_written_questions_need_a_chat_model(model_dir):
    plain = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False)
    plain.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        calibrate(plain, CORPUS, prompts=2, per_prompt=2, ratios=(1.0,), questions="model")
