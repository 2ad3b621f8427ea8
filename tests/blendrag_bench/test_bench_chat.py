"""bench chat on tiny models: records with the promised keys for every turn and config, turns
from 2 on taking the earlier turns' rows (exact for the full config, none without a cache), a
growing cache, the history workloads (new passages every turn: the history's rows reused, less
computed than without them, whole answers compared), and the command's JSON."""

from __future__ import annotations

import json

import pytest

from blendrag.cli import main
from blendrag_bench.chat_bench import ChatBenchConfig, format_table, run
from blendrag_bench.ttft import TTFTWorkload

TINY = TTFTWorkload(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=300,
                    chunks=3, chunk_tokens=40, prefix_tokens=8, suffix_tokens=8)
KEYS = {"turn", "config", "exact", "prefix_tokens", "ttft_s", "speedup_vs_full", "cache_bytes"}


@pytest.fixture(scope="module")
def records(model_dir):
    cfg = ChatBenchConfig(workloads=("text", "random"), model=str(model_dir("qwen2")),
                          random=TINY, turns=3, answer_tokens=8, passages=2, passage_tokens=60)
    return cfg, run(cfg)


@pytest.fixture(scope="module")
def history_records(model_dir):
    cfg = ChatBenchConfig(workloads=("history", "random-history"), model=str(model_dir("qwen2")),
                          random=TINY, turns=3, answer_tokens=16, passage_tokens=40,
                          turn_passages=2)
    return cfg, run(cfg)


def test_every_turn_of_every_config_is_recorded(records):
    cfg, rows = records
    assert len(rows) == 2 * 3 * 3  # workloads x configs x turns
    for r in rows:
        assert KEYS <= set(r) and r["ttft_s"] > 0 and r["full_ttft_s"] > 0
        assert r["speedup_vs_full"] == pytest.approx(r["full_ttft_s"] / r["ttft_s"])


@pytest.mark.parametrize("workload", ["text", "random"])
def test_later_turns_take_the_earlier_turns_rows(records, workload):
    _, rows = records
    by = {(r["config"], r["turn"]): r for r in rows if r["workload"] == workload}
    for config in ("full+prefix-cache", "blend+prefix-cache"):
        assert by[(config, 1)]["prefix_tokens"] == 0
        for turn in (2, 3):
            row, before = by[(config, turn)], by[(config, turn - 1)]
            # the turn before's prompt, to the last whole block
            assert row["prefix_tokens"] >= before["prompt_tokens"] - 32
            assert row["computed_tokens"] <= row["prompt_tokens"] - row["prefix_tokens"]
            assert row["cache_bytes"] >= before["cache_bytes"]
        assert by[(config, 3)]["cache_bytes"] > by[(config, 1)]["cache_bytes"]
    assert by[("full+prefix-cache", 2)]["exact"] and by[("full+prefix-cache", 2)]["prefix_exact"]
    assert by[("blend+prefix-cache", 2)]["prefix_exact"] is False
    assert all(by[("blend", t)]["prefix_tokens"] == 0 for t in (1, 2, 3))
    assert by[("blend", 3)]["cache_bytes"] == 0


def test_the_table_names_every_workload_and_the_target(records):
    cfg, rows = records
    text = format_table(rows, cfg)
    assert "workload: text" in text and "workload: random" in text
    assert text.count("target >= 10x") == 2
    assert text.count("against the exact path on its own prompts") == 2


@pytest.mark.parametrize("workload", ["text", "random"])
def test_blend_with_the_cache_is_set_against_an_exact_twin_on_its_own_prompts(records,
                                                                               workload):
    """Only the cached blend has a twin; from turn 2 on the twin's cache holds the same
    conversation, so it takes as many rows as the exact configuration's own run does."""
    _, rows = records
    by = {(r["config"], r["turn"]): r for r in rows if r["workload"] == workload}
    for turn in (1, 2, 3):
        blend = by[("blend+prefix-cache", turn)]
        assert blend["exact_ttft_s"] > 0
        assert blend["vs_exact"] == pytest.approx(blend["exact_ttft_s"] / blend["ttft_s"])
        assert "vs_exact" not in by[("full+prefix-cache", turn)]
        assert "vs_exact" not in by[("blend", turn)]
        if turn > 1:  # the turn before's prompt and answer, to the last whole block
            assert blend["exact_prefix_tokens"] >= by[("blend+prefix-cache", turn - 1)][
                "prompt_tokens"] - 32
        else:
            assert blend["exact_prefix_tokens"] == 0


def test_the_command_writes_json(tmp_path, capsys):
    out = tmp_path / "chat.json"
    code = main(["bench", "chat", "--workloads", "random", "--layers", "2", "--chunks", "2",
                 "--chunk-tokens", "40", "--turns", "2", "--answer-tokens", "4",
                 "--configs", "full+prefix-cache", "--no-progress", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["turn"] for r in data["records"]] == [1, 2]
    assert "full+prefix-cache" in capsys.readouterr().out


def test_bad_settings_are_refused(capsys):
    assert main(["bench", "chat", "--turns", "0"]) == 2
    assert "turns must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown or no workloads"):
        ChatBenchConfig(configs=("nope",))


@pytest.mark.parametrize("workload", ["history", "random-history"])
def test_new_passages_every_turn_reuse_the_history(history_records, workload):
    _, rows = history_records
    rows = [r for r in rows if r["workload"] == workload]
    assert [r["turn"] for r in rows] == [1, 2, 3]
    assert rows[0]["history_tokens"] == rows[0]["history_reused"] == 0
    for r in rows[1:]:
        assert r["history_tokens"] > 0 and r["history_reused"] >= 0.8 * r["history_tokens"]
        assert r["computed_tokens"] < r["computed_without"]
        assert r["ttft_s"] > 0 and r["without_ttft_s"] > 0 and r["full_ttft_s"] > 0
    if workload == "history":
        for r in rows:
            assert isinstance(r["same_answer"], bool) and r["answer_kl"] >= 0
            assert r["answer"] and r["answer_without"] and r["answer_full"]


def test_the_history_table_states_the_targets(history_records):
    cfg, rows = history_records
    text = format_table(rows, cfg)
    assert "workload: history" in text and "workload: random-history" in text
    assert text.count("(target >= 2x") == 2 and "whole answers" in text


def test_the_command_lines_default_configs_are_the_benchs_own():
    from blendrag_bench.chat_cli import CHAT_CONFIGS
    from blendrag_bench.chat_config import CONFIGS

    assert CHAT_CONFIGS == tuple(CONFIGS)


def test_the_exact_twin_prefills_every_turn_in_the_pooled_buffer(model_dir, monkeypatch):
    """The twin's turns in the conditions of the config's: a turn whose Prefill the bench still
    held made the twin's next turn allocate a buffer of its own, which slowed the exact side of
    'vs exact' on every second turn."""
    from blendrag_bench import chat_bench

    pooled: list[bool] = []
    forced = chat_bench.teacher_forced

    def seen(engine, layout, config, *args, **kwargs):
        pre = forced(engine, layout, config, *args, **kwargs)
        if config.mode == "full":  # the twin's (the blend config's own turns are blend)
            pooled.append(engine.runner._pool.lent(pre.fused))
        return pre

    monkeypatch.setattr(chat_bench, "teacher_forced", seen)
    cfg = ChatBenchConfig(workloads=("random",), random=TINY, turns=4, answer_tokens=4,
                          configs=("blend+prefix-cache",))
    run(cfg)
    assert len(pooled) == 4 and all(pooled[1:]), pooled  # turn 1: the twin's first buffer
