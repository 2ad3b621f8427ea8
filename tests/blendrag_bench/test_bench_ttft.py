"""bench ttft on a tiny random model: every mode's record carries its compute ideal and its
phase breakdown, and the breakdown table shows full, reuse, the fastest blend at 15 % and the
default."""

from __future__ import annotations

import pytest

from blendrag_bench import ttft
from blendrag_bench.ttft import TTFTWorkload, format_table, run

TINY = TTFTWorkload(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=300,
                    chunks=3, chunk_tokens=24, prefix_tokens=4, suffix_tokens=6, ratios=(0.15,),
                    selectors=("preview", "epic", "cacheblend"), repeats=1)


@pytest.fixture(scope="module")
def records():
    mp = pytest.MonkeyPatch()
    # process-wide allocator settings: not in a test run
    mp.setattr(ttft, "memory_mode", lambda: None)
    mp.setattr(ttft, "timing_mode", lambda: None)
    try:
        yield run(TINY)
    finally:
        mp.undo()


def test_every_mode_has_its_compute_ideal_and_phases(records):
    by = {(r["mode"], r["selector"]): r for r in records}
    full, reuse = by[("full", None)], by[("reuse", None)]
    assert full["ideal_speedup"] == pytest.approx(1.0)
    n, s = 4 + 3 * 24 + 6, 4 + 3 * 24
    assert reuse["ideal_speedup"] > 1 and reuse["ideal_speedup"] < n / (n - s)  # attention counts
    # the preview pass is a reuse pass on top of the blend pass
    assert by[("blend", "preview")]["ideal_speedup"] < by[("blend", "epic")]["ideal_speedup"]
    for r in records[1:]:  # every mode but HF's forward
        assert r["phase_s"] and sum(r["phase_s"].values()) > 0
        assert "attention" in r["phase_s"] and "mlp" in r["phase_s"]
    assert "rotate" in reuse["phase_s"] and "rotate" not in full["phase_s"]


def test_the_table_prints_ideal_share_and_the_breakdown(records):
    text = format_table(records, TINY)
    assert "ideal" in text and "share" in text
    breakdown = text.split("where the time goes")[1].splitlines()
    names = [line.split()[0] for line in breakdown[2:]]
    fastest = max((r for r in records if r["mode"] == "blend"),
                  key=lambda r: r["speedup_vs_full"])
    assert names[:2] == ["full", "reuse"]
    assert f"{fastest['selector']}@15%" in names
    assert "preview@20%" not in names  # the default's ratio is not in this run
