"""`blendrag bench match` on small sizes: every chunk of the prompt is found, fast."""

from __future__ import annotations

import json

import pytest

from blendrag_bench.match import MatchBenchConfig, format_table, run_size


def test_run_size_finds_every_prompt_chunk():
    cfg = MatchBenchConfig(sizes=(50,), repeats=3, prompt_chunks=5, prompt_chars=4_000)
    record = run_size(cfg, 50)
    assert (record.indexed, record.found, record.expected) == (50, 5, 5)
    assert 0 < record.find_median_ms < 100
    assert "| 50 |" in format_table([record], cfg)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="prompt_chunks"):
        MatchBenchConfig(sizes=(3,), prompt_chunks=8)
    with pytest.raises(ValueError, match="cannot hold"):
        MatchBenchConfig(prompt_chars=100)


def test_cli_writes_the_table_and_json(tmp_path, capsys):
    from blendrag.cli import main

    out = tmp_path / "m.json"
    assert main(["bench", "match", "--sizes", "20", "--repeats", "2", "--prompt-chunks", "3",
                 "--prompt-chars", "2000", "--json", str(out)]) == 0
    assert "| 20 |" in capsys.readouterr().out
    assert json.loads(out.read_text())["records"][0]["found"] == 3
