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


def test_with_a_device_tier_reuse_is_timed_from_it_and_from_the_ram_tier(monkeypatch):
    """On a GPU the engine keeps hot chunks in a device tier: the reuse row is then its hits,
    and one more row times reuse with the rows copied from the host's RAM tier (a CPU engine
    given a device tier here)."""
    import torch

    from blendrag.engine.caches.device_tier import DeviceTier

    build = ttft.build_engine

    def with_tier(w):
        engine = build(w)
        engine.cache.device_tier = DeviceTier(1 << 26, torch.device("cpu"))
        return engine

    monkeypatch.setattr(ttft, "build_engine", with_tier)
    monkeypatch.setattr(ttft, "memory_mode", lambda: None)
    monkeypatch.setattr(ttft, "timing_mode", lambda: None)
    records = run(TINY)
    by = {(r["mode"], r["selector"]): r for r in records}
    device, ram = by[("reuse", None)], by[("reuse", ttft.RAM_TIER)]
    assert device["device_hits"] == 3 + 1 and ram["device_hits"] == 0  # chunks and prefix
    row = 2 * 2 * 2 * (64 // 4) * 4  # K and V, 2 layers, 2 KV heads, head size 16, float32
    assert ram["reused_bytes"] == device["reused_bytes"] == (4 + 3 * 24) * row
    assert "load" in ram["phase_s"] and ram["ideal_speedup"] == device["ideal_speedup"]
    assert "reuse, RAM tier" in format_table(records, TINY)


def test_the_json_says_what_the_runs_were_measured_on(tmp_path, capsys):
    """The JSON holds the workload the text's header names (shape, tokens, dtype, device,
    repeats), beside the runs and the summary."""
    import json

    from blendrag.cli import main

    out = tmp_path / "ttft.json"
    assert main(["bench", "ttft", "--layers", "2", "--hidden", "64", "--heads", "2",
                 "--kv-heads", "1", "--intermediate", "128", "--chunks", "2", "--chunk-tokens",
                 "16", "--suffix-tokens", "4", "--repeats", "1", "--no-progress", "--json",
                 str(out)]) == 0
    got = json.loads(out.read_text())
    assert {"threads", "torch", "workload", "runs", "summary"} <= set(got)
    assert got["workload"]["layers"] == 2 and got["workload"]["chunk_tokens"] == 16
