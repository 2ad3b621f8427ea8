"""bench ttft --tier on a tiny random model: the six rows, and every timed request run over
the runner's pooled KV buffer (a request the bench held on to kept it from the next one,
which then took a buffer of its own: a new allocation, and no captured passes on a GPU)."""

from __future__ import annotations

import math

from blendrag_bench import ttft_tiers
from blendrag_bench.ttft import TTFTWorkload
from helpers.recorders import pooled_prefills

TINY = TTFTWorkload(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=300,
                    chunks=3, chunk_tokens=24, prefix_tokens=4, suffix_tokens=6, ratios=(0.2,),
                    selectors=("cacheblend",), repeats=2)


def test_every_timed_request_gets_the_pooled_buffer(monkeypatch, tmp_path):
    pooled = pooled_prefills(monkeypatch)
    cfg = ttft_tiers.TierBenchConfig(workload=TINY, tier="disk", directory=tmp_path)
    records = ttft_tiers.run(cfg)
    assert len(pooled) == 5 * (TINY.repeats + 1)
    assert all(pooled), pooled
    by = {r["mode"]: r for r in records}
    assert list(by) == ["full", "sequential", "pipelined", "auto", "compute-only", "load-only"]
    assert by["full"]["kl_vs_full"] == 0.0 and by["pipelined"]["pipelined"]
    assert all(math.isfinite(r["kl_vs_full"]) and len(r["ratios"]) == TINY.repeats
               for r in records if r["mode"] != "load-only")
    assert "pipelined" in ttft_tiers.format_table(records, cfg)


def test_every_row_is_the_median_of_its_calls(monkeypatch, tmp_path):
    """With an even number of calls every row takes the mean of the middle two, as load-only
    does (the engine rows took the slower one: the PASS/MISS lines compared unlike figures)."""
    import statistics

    samples: dict[str, list] = {}
    real = ttft_tiers._records

    def kept(cfg, got, keys):
        samples.update(got)
        return real(cfg, got, keys)

    monkeypatch.setattr(ttft_tiers, "_records", kept)
    records = ttft_tiers.run(ttft_tiers.TierBenchConfig(workload=TINY, tier="disk",
                                                        directory=tmp_path))
    for r in records:
        if r["mode"] != "load-only":
            times = [s.timing.ttft_s for s, _ in samples[r["mode"]]]
            assert len(times) == 2 and r["ttft_s"] == statistics.median(times)


def test_protection_rows_run_at_the_asked_bandwidth(tmp_path):
    """`--protection` with `--bandwidth`: the protected stores are throttled as the plain tier
    is (they read at full speed, six times the asked rate, as if the flag were not given)."""
    from blendrag_bench import ttft_protection

    cfg = ttft_tiers.TierBenchConfig(workload=TINY, tier="disk", directory=tmp_path,
                                     bandwidth_gbps=0.005)
    rows = {(r["protection"], r["row"]): r for r in ttft_protection.run(cfg, ("plain",))}
    assert rows[("plain", "load-only")]["gbps"] <= 0.005 * 1.2
