"""bench ttft's headline lines: median and range over runs, PASS only when every run meets
the target."""

from __future__ import annotations

from blendrag_bench.ttft_summary import format_summary, summarize


def _records(hf: float, full: float, blend: float, reuse: float, peaks=(100.0, 80.0)) -> list:
    def rec(mode, selector, ratio, ttft, peak=50.0):
        return {"mode": mode, "selector": selector, "ratio": ratio, "ttft_s": ttft,
                "speedup_vs_full": full / ttft, "peak_extra_mib": peak}
    return [rec("hf", None, None, hf), rec("full", None, None, full, peaks[0]),
            rec("reuse", None, None, reuse), rec("blend", "cacheblend", 0.15, blend, peaks[1])]


def test_a_miss_in_one_run_is_a_miss() -> None:
    runs = [_records(1.0, 0.936, 0.2, 0.05), _records(1.0, 1.0, 0.3, 0.05)]
    by = {s["figure"]: s for s in summarize(runs)}
    hf = by["full vs HF forward"]
    assert round(hf["min"], 3) == -0.064 and hf["max"] == 0.0
    assert (hf["pass"], hf["runs_meeting_target"]) == (False, 1)
    blend = by["blend cacheblend@15% speedup"]
    assert (blend["min"], blend["max"], blend["pass"]) == (1.0 / 0.3, 0.936 / 0.2, False)
    assert by["reuse speedup"]["pass"] is None  # no target: its share of the ideal has one
    assert by["blend cacheblend@15% peak minus full's"]["values"] == [-20.0, -20.0]
    lines = format_summary(summarize(runs))
    assert lines[0] == ("full vs HF forward: −3.2% (median of 2 runs, range −6.4% to +0.0%); "
                        "target within ±5 %: MISS (1 of 2 runs met it)")


def test_one_run_prints_the_figure_and_its_verdict() -> None:
    lines = format_summary(summarize([_records(1.0, 0.997, 0.21, 0.034)]))
    assert lines[0] == "full vs HF forward: −0.3%; target within ±5 %: PASS"
    assert lines[1] == "blend cacheblend@15% speedup: 4.75x; target >= 4x: PASS"
    assert not any("profile" in line for line in lines)  # figures absent from the run: no line


def test_the_fastest_selector_at_15_percent_and_its_share_of_the_ideal() -> None:
    records = _records(1.0, 1.0, 0.25, 0.05)
    records[-1]["ideal_speedup"] = 5.0  # cacheblend@15 %: 4x of 5x
    records.append({"mode": "blend", "selector": "epic", "ratio": 0.15, "ttft_s": 0.18,
                    "speedup_vs_full": 1.0 / 0.18, "peak_extra_mib": 0.0, "ideal_speedup": 6.0})
    by = {s["figure"]: s for s in summarize([records])}
    fastest = by["fastest blend@15% speedup"]
    assert fastest["median"] == 1.0 / 0.18 and fastest["pass"] is True  # 5.56x >= 5.4x
    assert by["fastest blend@15% share of its compute ideal"]["median"] == (1.0 / 0.18) / 6.0
    assert "reuse share of its compute ideal" not in by  # reuse has no ideal in these records
    lines = format_summary(summarize([records]))
    assert "fastest blend@15% share of its compute ideal: 0.93" in lines


def test_the_default_and_reuses_share_of_its_ideal_have_the_targets_the_docs_state() -> None:
    """The default (preview@20 %) >= 3.3x and reuse's share of its compute ideal >= 0.7, as
    docs/benchmarks.md holds them; reuse's speed-up has none (its ideal is below any fixed
    multiple asked of it before: 40x against an ideal of 37.6x)."""
    records = _records(1.0, 1.0, 0.25, 0.05)
    records[2]["ideal_speedup"] = 37.6  # reuse: 20x of 37.6x
    records.append({"mode": "blend", "selector": "preview", "ratio": 0.20, "ttft_s": 0.5,
                    "speedup_vs_full": 2.0, "peak_extra_mib": 0.0})
    by = {s["figure"]: s for s in summarize([records])}
    assert by["blend preview@20% (the default) speedup"]["pass"] is False  # 2x
    assert by["reuse share of its compute ideal"]["pass"] is False  # 0.53
