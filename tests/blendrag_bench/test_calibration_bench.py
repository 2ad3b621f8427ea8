"""`blendrag bench calibration`: calibrated on half a dataset's passages, the choice measured on
the other half's own questions (the demo model, a few synthetic items)."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine
from blendrag_bench.calibration_bench import CalibrationBenchConfig, format_report, run


@pytest.fixture(scope="module")
def demo() -> BlendEngine:
    return BlendEngine.from_pretrained("demo", device="cpu")


def test_the_choice_is_checked_on_the_held_out_half(demo):
    cfg = CalibrationBenchConfig(items=8, prompts=3, per_prompt=3, ratios=(0.3, 1.0),
                                 same_answer=1.0, answer_kl=1e-9, answer_tokens=8)
    result = run(demo, cfg)
    assert (result["items"], result["calibration_prompts"]) == (8, 3)
    for name in ("whole answer", "first sentence"):
        t = result["targets"][name]
        assert t["ratio"] == 1.0  # only a full recompute keeps answer KL at 0
        assert t["held_out"]["ratio"] == 1.0 and t["held_out"]["same_answer"] == 1.0
        assert t["generalises"] is True
        assert t["held_out_default"]["ratio"] == 0.2
    report = format_report(result)
    assert "chosen: 1; held out: same answer 1.00" in report and "generalises" in report
    assert "Ran: flow `engine`" in report
    with pytest.raises(ValueError, match="items"):
        CalibrationBenchConfig(items=2)
