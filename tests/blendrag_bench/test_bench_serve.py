"""`blendrag bench serve` on the demo model: every run's rows are there, each served answer is
the one-at-a-time answer, and the command prints its table and JSON."""

from __future__ import annotations

import json

import pytest

from blendrag import BlendEngine
from blendrag_bench.serve import ServeBenchConfig, run
from blendrag_bench.serve_report import format_row

SMALL = dict(requests=3, passages=2, passage_tokens=30, answer_tokens=4)


def test_runs_side_by_side_with_the_baseline():
    engine = BlendEngine.from_pretrained("demo", device="cpu")
    rows = run(engine, ServeBenchConfig(users=(1, 3), rates=(50.0,), modes=("full", "default"),
                                        **SMALL))
    assert [(r["mode"], r["run"]) for r in rows] == [
        (m, n) for m in ("full", "default")
        for n in ("one at a time", "1 users", "3 users", "poisson 50/s")]
    for row in rows:
        assert row["requests"] == 3 and row["tokens_per_s"] > 0
        assert row["ttft_p95_s"] >= row["ttft_p50_s"] > 0
        assert 0 < row["cores_busy"] <= 1.05  # CPU seconds over wall x cores (clock rounding)
        # where the time to first token went: queued, the prefill's own work, the rest
        assert row["work_p95_s"] > 0 and row["queued_p95_s"] >= 0
        assert row["queued_p95_s"] + row["work_p95_s"] <= row["ttft_p95_s"] * 1.5
        if row["run"] == "one at a time":
            assert row["queued_p95_s"] == 0  # never queued
        if row["run"] != "one at a time":
            assert row["same_answer"] == 3  # served together, answered as alone
            assert row["same_first"] == 3 and row["agreeing_p50"] == SMALL["answer_tokens"]
            assert row["throughput_x"] > 0
            assert 1.0 <= row["mean_batch"] <= 3
        if row["run"] == "1 users":  # one user's first request opens it, the rest follow
            assert row["ttft_p95_later_s"] > 0 and "ttft_p95_later_x" in row
        if row["run"] == "3 users":  # every request is a user's first: no later ones
            assert "ttft_p95_later_s" not in row


def test_rounds_serve_the_requests_again_past_each_users_first():
    """With rounds, every user past its first request keeps its own rhythm: the served runs
    send the requests that many times over (each still answered as alone), and their
    throughput is requests per second against the baseline's."""
    engine = BlendEngine.from_pretrained("demo", device="cpu")
    rows = run(engine, ServeBenchConfig(users=(3,), modes=("default",), rounds=2, **SMALL))
    base, served = rows
    assert base["requests"] == 3 and served["requests"] == 6
    assert served["same_answer"] == 6  # the requests in each round answered as alone
    assert served["ttft_p95_later_s"] > 0  # 3 of the 6 came after their user's first
    assert served["throughput_x"] == pytest.approx(
        served["requests_per_s"] / base["requests_per_s"])


def test_answers_that_part_say_where():
    """An answer unlike alone's is reported with the first tokens and the leading tokens
    shared (bf16 on a GPU parts answers where a batch rounds otherwise)."""
    from blendrag_bench.serve_report import _agreeing

    assert _agreeing([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert _agreeing([5, 2], [1, 2]) == 0 and _agreeing([1, 2], [1, 2]) == 2
    row = {"mode": "full", "run": "16 users", "requests": 16, "requests_per_s": 5.0,
           "tokens_per_s": 320.0, "ttft_p50_s": 1.0, "ttft_p95_s": 2.0, "tpot_p50_s": 0.02,
           "tpot_p95_s": 0.03, "throughput_x": 4.8, "ttft_p95_x": 21.0, "tpot_p50_x": 0.5,
           "same_answer": 0, "same_first": 16, "agreeing_p50": 7.5}
    assert "same answer 0/16 (first token 16/16, 7.5 leading tokens the same at the " \
           "median)" in format_row(row)
    assert "first token" not in format_row({**row, "same_answer": 16})


def test_bad_settings_are_refused():
    for bad in ({"users": (), "rates": ()}, {"users": (0,)}, {"rates": (-1.0,)},
                {"modes": ("fast",)}, {"requests": 0}, {"rounds": 0}):
        with pytest.raises(ValueError):
            ServeBenchConfig(**bad)


def test_command_prints_the_table_and_json(tmp_path, capsys):
    from blendrag.cli import main

    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--model", "demo", "--device", "cpu", "--users", "2",
                 "--requests", "2", "--passages", "2", "--passage-tokens", "20",
                 "--answer-tokens", "3", "--modes", "full", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "one at a time" in text and "2 users" in text and "same answer 2/2" in text
    assert "requests a step" in text
    got = json.loads(out.read_text())  # the rows, and what they were measured on
    assert [r["run"] for r in got["rows"]] == ["one at a time", "2 users"]
    assert got["workload"]["answer_tokens"] == 3 and got["device"] == "cpu" and got["model"]


def test_the_one_at_a_time_baseline_prefills_every_request_in_the_pooled_buffer(monkeypatch):
    """The baseline's requests in the same conditions: one whose stream the loop still held
    made the next allocate a buffer of its own (every second one), which slowed the baseline
    and flattered every 'x one at a time' figure."""
    from blendrag import BlendConfig, GenerationConfig
    from blendrag.engine.compute import fused_kv
    from blendrag_bench.serve import one_at_a_time, prompts

    engine = BlendEngine.from_pretrained("demo", device="cpu")
    layouts = prompts(engine, ServeBenchConfig(**SMALL))
    engine.prefill(layouts[0], BlendConfig(mode="full"))  # the pool holds a buffer
    takes: list[bool] = []
    take = fused_kv.BufferPool.take

    def seen(pool, *args, **kwargs):
        had = pool._kv
        out = take(pool, *args, **kwargs)
        takes.append(had is not None and out.base[0] is had[0])
        return out

    monkeypatch.setattr(fused_kv.BufferPool, "take", seen)
    one_at_a_time(engine, layouts, BlendConfig(mode="full"),
                  GenerationConfig(max_new_tokens=2, eos_token_ids=()))
    assert len(takes) == len(layouts) and all(takes), takes
