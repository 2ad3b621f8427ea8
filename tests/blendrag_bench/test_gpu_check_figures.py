"""The GPU check's headline figures from their phases' records (the benches stood in for):
which record each figure is, its target, its unit in the summary."""

from __future__ import annotations

import pytest


def _ttft_record(mode, selector=None, ratio=None, speedup=2.0, device_hits=0):
    return {"mode": mode, "selector": selector, "ratio": ratio, "speedup_vs_full": speedup,
            "ttft_s": 0.1 / speedup, "device_hits": device_hits}


@pytest.mark.parametrize("hits", [0, 7])
def test_the_reuse_targets_are_reported_whether_or_not_the_device_tier_hit(monkeypatch, hits):
    """Reuse from the device tier is a GPU target: without device-tier hits (no tier, or it
    held nothing) it is reported as a miss, never left out; reuse from the RAM tier is the
    reuse row itself then, or the row the bench times with the device tier set aside."""
    from blendrag_bench import ttft as bench
    from blendrag_bench.gpu import speed

    records = [_ttft_record("hf", speedup=1.0), _ttft_record("full", speedup=1.0),
               _ttft_record("prefix", speedup=1.1),
               _ttft_record("reuse", speedup=12.0, device_hits=hits),
               _ttft_record("blend", "preview", 0.2, 3.0), _ttft_record("blend", "epic", 0.15, 4.0)]
    if hits:
        records.append(_ttft_record("reuse", bench.RAM_TIER, speedup=4.0))
    monkeypatch.setattr(bench, "run", lambda w: records)
    monkeypatch.setattr(bench, "format_table", lambda records, w: "")
    out = speed.ttft(lambda line: None, small=True, prompt="3k")
    if hits:
        assert out["3k reuse, device tier"] == (12.0, ">= 10x", True)
        assert out["3k reuse, RAM tier"] == (4.0, ">= 5x", False)
    else:
        assert out["3k reuse, device tier"] == ("no device-tier hits", ">= 10x", False)
        assert out["3k reuse, RAM tier"] == (12.0, ">= 5x", True)
    assert out["3k fastest blend@15%"] == (4.0, ">= 3.5x", True)


def test_the_chat_blend_figure_is_the_chat_benchs_verdict(monkeypatch):
    """Blend with the prefix cache against its exact twin at turns >= 2 (chat_bench's
    verdict): not turn 1 (nothing cached yet), not any speed-up over a full prefill."""
    from blendrag_bench import chat_bench
    from blendrag_bench.gpu import speed

    def turn(config, n, speedup, vs_exact=None):
        r = {"workload": "random", "config": config, "turn": n, "speedup_vs_full": speedup,
             "ttft_s": 0.01, "full_ttft_s": 0.01 * speedup}
        return r if vs_exact is None else {**r, "vs_exact": vs_exact}

    random = ([turn("full+prefix-cache", n, 12.0 + n) for n in range(1, 5)]
              + [turn("blend+prefix-cache", 1, 0.5, 0.4)]
              + [turn("blend+prefix-cache", n, 3.0, 0.97 + n / 100) for n in range(2, 5)])
    history = [{"workload": "random-history", "turn": n, "ttft_s": 0.01,
                "without_ttft_s": 0.03, "full_ttft_s": 0.04} for n in range(1, 5)]

    def run(cfg):
        return random if cfg.workloads == ("random",) else history

    monkeypatch.setattr(chat_bench, "run", run)
    monkeypatch.setattr(chat_bench, "format_table", lambda records, cfg: "")
    out = speed.chat(lambda line: None, small=True)
    assert out["chat turns >= 2, blend+prefix-cache vs its exact twin"] == (0.99, ">= 0.95x",
                                                                           True)
    assert out["chat turns >= 2, full+prefix-cache"] == (14.0, ">= 10x", True)
    assert "chat, blend turns" not in out


@pytest.mark.parametrize("figure, value, shown", [
    ("RAM tier put, page-locked (map, register, copy) (ms)", 12.3, "12.3 ms"),
    ("serve 16 users, full: leading tokens the same as alone, median", 8.0, "8 tokens"),
    ("attention 3k reuse, sdpa mask (us)", 72.04, "72.0 us"),
    ("decode engine graph (tokens/s)", 61.25, "61.2 tokens/s"),
    ("host -> device, page-locked, one copy (GB/s)", 51.234, "51.23 GB/s"),
    ("3k full vs HF forward", -0.012, "-1.2%"),
    ("pipelined TTFT / max(load, compute), disk", 1.104, "1.10"),
    ("3k reuse, RAM tier", 6.5, "6.50x")])
def test_each_figure_is_shown_in_its_unit(figure, value, shown):
    from blendrag_bench.gpu.summary import format_value

    assert format_value(figure, value) == shown


def test_a_ttft_figure_of_a_mode_that_ran_full_says_so(monkeypatch):
    """A request the engine ran as a full prefill (``ran_full``) is no figure of its mode."""
    from blendrag_bench import ttft as bench
    from blendrag_bench.gpu import speed

    records = [_ttft_record("hf", speedup=1.0), _ttft_record("full", speedup=1.0),
               _ttft_record("prefix", speedup=1.1), _ttft_record("reuse", speedup=12.0),
               {**_ttft_record("blend", "preview", 0.2, 1.02), "ran_full": True},
               _ttft_record("blend", "epic", 0.15, 4.0)]
    monkeypatch.setattr(bench, "run", lambda w: records)
    monkeypatch.setattr(bench, "format_table", lambda records, w: "")
    out = speed.ttft(lambda line: None, small=True, prompt="3k")
    assert out["3k default (preview@20%)"] == ("1.02x (ran full)", ">= 2.5x", False)
    assert out["3k slowest mode vs full"] == ("1.02x (ran full)", ">= 0.95x", True)
    assert out["3k fastest blend@15%"] == (4.0, ">= 3.5x", True)
