"""What a calibration measures and for how long (``calibration/plan.py``), and its progress
kept prompt by prompt and taken up again (``calibration/saved.py``)."""

from __future__ import annotations

import json

import pytest

from blendrag import BlendEngine
from blendrag.calibration.plan import PromptPlan, min_prompts
from blendrag.calibration.run import calibrate
from blendrag.calibration.saved import Result, SavedProgress, held
from blendrag.calibration.target import CalibrationTarget, lower_bound
from blendrag.store.auth import StoreKeys
from helpers.tiny import PASSAGES

TARGET = CalibrationTarget(same_answer=0.9, answer_kl=0.02)
CORPUS = [*PASSAGES, "She lives in Berlin and works as an engineer at a small company. ",
          "Numbers 0123456789 and punctuation follow the quick brown fox. "]


def test_the_fewest_prompts_that_can_reach_a_share_target():
    assert min_prompts(TARGET) == 15
    assert lower_bound(1.0, 14) < 0.9 <= lower_bound(1.0, 15)
    assert min_prompts(CalibrationTarget(same_answer=None, answer_kl=0.02)) == 1
    words = PromptPlan(TARGET, 8, (0.2, 1.0), ("preview",)).words()
    assert "needs at least 15 prompts" in words and "with 8 only ratio 1.0" in words
    assert "1 ratios measured" in words  # 1.0 is a full prefill's rows: not measured


def test_a_ratio_that_cannot_meet_the_target_is_dropped():
    plan = PromptPlan(TARGET, 24, (0.2, 0.5, 1.0), ("preview",))
    assert plan.alive() == [("preview", 0.2), ("preview", 0.5)]
    plan.record(("preview", 0.2), same=True, answer_kl=0.001)
    assert ("preview", 0.2) in plan.alive()
    plan.record(("preview", 0.2), same=False, answer_kl=0.001)
    # 23 of 24 at best: its 90 % bound is under 0.9, whatever the prompts to come
    assert lower_bound(23 / 24, 24) < 0.9 and plan.alive() == [("preview", 0.5)]
    plan.record(("preview", 0.5), same=True, answer_kl=24 * 0.02 + 1e-6)  # the KL part
    assert plan.alive() == [] and plan.dropped == [("preview", 0.2), ("preview", 0.5)]


def test_the_budget_shrinks_the_prompts_to_what_fits(monkeypatch):
    import blendrag.calibration.plan as module

    clock = [100.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    plan = PromptPlan(TARGET, 24, (0.2,), ("preview",), budget_s=60.0)
    assert plan.fits(0) == 24  # nothing measured yet: no pace
    clock[0] += 10.0  # one prompt took 10 s: 5 more fit in the 50 s left
    assert plan.fits(1) == 6 and plan.planned == 6
    assert PromptPlan(TARGET, 24, (0.2,), ("preview",)).fits(3) == 24  # no budget
    with pytest.raises(ValueError, match="budget"):
        PromptPlan(TARGET, 24, (0.2,), ("preview",), budget_s=0.0)


ROW = [Result(None, None, True, True, 0.0, 0.5), Result("preview", 0.2, False, True, 0.01, 0.2)]
SETTINGS = {"model": "m", "corpus": "c", "ratios": [0.2]}


def test_saved_prompts_come_back_for_the_same_settings_only(tmp_path):
    saved = SavedProgress(tmp_path, SETTINGS)
    saved.start([])
    saved.add(0, ROW)
    saved.add(1, ROW)
    assert SavedProgress(tmp_path, SETTINGS).load() == [ROW, ROW]
    assert SavedProgress(tmp_path, {**SETTINGS, "ratios": [0.3]}).load() == []
    saved.done()
    assert SavedProgress(tmp_path, SETTINGS).load() == [] and not saved.path.exists()


@pytest.mark.parametrize("bad", [
    '{"body": "{\\"prompt\\": 1, \\"results\\": [[null, null, true, true, 0, NaN]]}", "tag": ""}',
    '{"body": "{\\"prompt\\": 1, \\"results\\": [[null, null, 1, true, 0, 0.1]]}", "tag": ""}',
    '{"body": "{\\"prompt\\": 1, \\"results\\": [[\\"p\\", 0.0, true, true, 0, 0.1]]}", "tag": ""}',
    '{"body": "{\\"prompt\\": 7, \\"results\\": [[null, null, true, true, 0, 0.1]]}", "tag": ""}',
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]",
    "not json at all",
])
def test_a_damaged_or_planted_line_ends_what_is_taken_up(tmp_path, bad):
    saved = SavedProgress(tmp_path, SETTINGS)
    saved.start([ROW])
    with saved.path.open("a") as f:
        f.write(bad + "\n")
    saved.add(2, ROW)  # after the bad line: measured again, never taken
    assert SavedProgress(tmp_path, SETTINGS).load() == [ROW]


def test_with_store_keys_a_line_not_signed_by_them_is_refused(tmp_path):
    keys = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
    other = StoreKeys({"k9": b"an-attackers-secret-0123456789"}, "k9")
    SavedProgress(tmp_path, SETTINGS, keys).start([ROW])
    assert SavedProgress(tmp_path, SETTINGS, keys).load() == [ROW]
    forged = SavedProgress(tmp_path, SETTINGS, other)
    forged.start([ROW, ROW])  # the attacker rewrites the file with its own key
    assert SavedProgress(tmp_path, SETTINGS, keys).load() == []
    line = json.loads(forged.path.read_text().splitlines()[0])
    assert line["tag"].startswith("k9:")


def test_signed_lines_of_another_calibration_are_not_taken(tmp_path):
    """Each line is signed with its settings' digest: lines copied from another calibration's
    file (another answer length) after this one's signed settings line are refused, though
    the store's keys signed them."""
    keys = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
    mine = SavedProgress(tmp_path, SETTINGS, keys)
    mine.start([])
    other = SavedProgress(tmp_path, {**SETTINGS, "answer_tokens": 1}, keys)
    other.start([ROW, ROW])
    spliced = other.path.read_text().splitlines()[1:]
    with mine.path.open("a") as f:
        f.write("\n".join(spliced) + "\n")
    assert SavedProgress(tmp_path, SETTINGS, keys).load() == []


@pytest.fixture(scope="module")
def engine(model_dir) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chunk_prefix="")


def test_a_stopped_calibration_goes_on_from_its_saved_prompts(engine, tmp_path):
    target = CalibrationTarget(same_answer=None, answer_kl=1.0, answer_tokens=6)
    kept: list[SavedProgress] = []

    def saved(settings: dict) -> SavedProgress:
        kept.append(SavedProgress(tmp_path, settings))
        return kept[-1]

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt  # the user's Ctrl-C, a kill
    with pytest.raises(KeyboardInterrupt):
        calibrate(engine, CORPUS, target, prompts=4, per_prompt=3, ratios=(0.3,),
                  on_prompt=stop_after_two, saved=saved)
    assert len(kept[0].load()) == 2
    seen: list[int] = []
    again = calibrate(engine, CORPUS, target, prompts=4, per_prompt=3, ratios=(0.3,),
                      on_prompt=lambda done, total: seen.append(done), saved=saved)
    assert seen == [3, 4] and again.prompts == 4  # prompts 1 and 2 were not measured again
    whole = calibrate(engine, CORPUS, target, prompts=4, per_prompt=3, ratios=(0.3,))
    for a, b in zip(again.frontier, whole.frontier):  # the same answers as an unbroken run
        assert (a.ratio, a.same_answer, a.prompts) == (b.ratio, b.same_answer, b.prompts)
        assert a.answer_kl == pytest.approx(b.answer_kl, abs=1e-6)


def test_a_calibration_resumes_only_prompts_made_the_same_way(engine, model_dir):
    """The saved progress is named by how its prompts are made too (the flow in words: chunk
    prefix, context, separators; the chat template's use; the system message), not the flow's
    name alone: a resume under another chunk prefix or chat setting measures afresh."""
    from blendrag.calibration.flows import flow_settings, make_flow

    def settings(e: BlendEngine) -> dict:
        return flow_settings(make_flow("integration", e), e)

    other = BlendEngine.from_pretrained(model_dir("llama"), device="cpu",
                                        chunk_prefix="Context:\n")
    chat = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chunk_prefix="",
                                       chat=True, system="Be brief.")
    assert settings(engine) == settings(engine)
    assert len({str(settings(e)) for e in (engine, other, chat)}) == 3


def test_progress_is_never_written_through_a_planted_link(tmp_path):
    """Names planted in the progress folder as links (the temporary file, the progress file
    itself) are not followed: nothing is written outside the store."""
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    saved = SavedProgress(tmp_path / "kv", SETTINGS)
    saved.path.parent.mkdir(parents=True)
    saved.path.with_suffix(".tmp").symlink_to(outside)  # the old fixed temporary name
    saved.start([ROW])
    assert outside.read_text() == "kept"
    assert SavedProgress(tmp_path / "kv", SETTINGS).load() == [ROW]
    saved.path.unlink()
    saved.path.symlink_to(outside)
    with pytest.raises(OSError):
        saved.add(1, ROW)
    assert outside.read_text() == "kept"


def test_the_pace_of_a_resumed_run_is_its_own_prompts(monkeypatch):
    """Prompts taken from an earlier run cost nothing now: counted in the pace, they made one
    new prompt in 2 s look like six in 2 s, and the run went past its budget."""
    import time

    plan = PromptPlan(TARGET, 24, (0.2,), ("preview",), budget_s=3.0)
    monkeypatch.setattr(time, "perf_counter", lambda: plan.started + 2.0)
    assert plan.fits(6, saved=5) == 6  # 1 s left, a prompt takes 2 s: none more
    assert PromptPlan(TARGET, 24, (0.2,), ("preview",), budget_s=3.0,
                      started=plan.started).fits(6) == 9  # without the saved ones set apart


def test_a_second_run_of_the_same_settings_saves_nothing_while_the_first_holds_them(
        tmp_path, caplog):
    first = SavedProgress(tmp_path, SETTINGS)
    with held(first):
        first.start([])
        first.add(0, ROW)
        second = SavedProgress(tmp_path, SETTINGS)
        with held(second):
            assert second.path is None
            assert "another calibration of the same settings" in caplog.text
            second.start([ROW, ROW])  # nothing written: the first run's file is its own
            second.add(1, ROW)
        second.done()
        first.add(1, ROW)
        assert SavedProgress(tmp_path, SETTINGS).load() == [ROW, ROW]
    third = SavedProgress(tmp_path, SETTINGS)  # the first let go: the next run holds them
    with held(third):
        assert third.path is not None and third.load() == [ROW, ROW]


def test_a_run_stopped_by_an_error_lets_go_of_its_progress(tmp_path):
    first = SavedProgress(tmp_path, SETTINGS)
    with pytest.raises(KeyboardInterrupt), held(first):
        first.start([ROW])
        raise KeyboardInterrupt
    again = SavedProgress(tmp_path, SETTINGS)
    with held(again):
        assert again.path is not None and again.load() == [ROW]


def test_a_namespace_keeps_its_progress_apart(tmp_path):
    default = SavedProgress(tmp_path, SETTINGS)
    default.start([ROW, ROW])
    tenant = SavedProgress(tmp_path, SETTINGS, ns_id="ab" * 8)
    assert tenant.path.parent == tmp_path / "calibration-progress" / ("ab" * 8)
    assert tenant.load() == []
    tenant.path.parent.mkdir()
    tenant.path.write_bytes(default.path.read_bytes())  # another namespace's lines, copied
    assert tenant.load() == []
    tenant.start([ROW])
    assert SavedProgress(tmp_path, SETTINGS, ns_id="ab" * 8).load() == [ROW]
    assert SavedProgress(tmp_path, SETTINGS).load() == [ROW, ROW]
