"""Report files from a hand-made report, and `blendrag bench quality` end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from blendrag.cli import main
from blendrag_bench.quality import ConfigSummary, QualityReport
from blendrag_bench.report import format_markdown, write_report


def _summary(mode, selector, ratio, quality, ttft) -> ConfigSummary:
    return ConfigSummary(mode=mode, selector=selector, ratio=ratio, same_answer=quality,
                         answer_kl=0.02, quality=quality,
                         exact_match=quality / 2,
                         first_token_agreement=1.0, kl=0.01, ttft_s=ttft,
                         speedup_vs_full=1.0 / ttft,
                         recompute_fraction=ratio or 0.0,
                         compute_fraction=ratio or 1.0, n=4,
                         quality_by_kind={"single": quality, "pronoun": 0.5})


def _report() -> QualityReport:
    rows = [_summary("full", None, None, 0.9, 1.0), _summary("prefix", None, None, 0.9, 0.9),
            _summary("reuse", None, None, 0.4, 0.2)]
    rows += [
        _summary("blend", s, r, 0.5 + r, 0.25 + r)
        for s in ("cacheblend", "epic")
        for r in (0.1, 0.3)
    ]
    return QualityReport(model="demo", dataset="synthetic", device="cpu", dtype="float32", items=4,
                         skipped=0,
                         kinds=["single", "pronoun"], metrics=["qa_f1"], summaries=rows,
                         examples=[])


def test_markdown_table_and_kinds() -> None:
    md = format_markdown(_report())
    lines = md.splitlines()
    assert lines[0].startswith("Quality vs TTFT: model `demo`")
    assert (
        "| blend | epic | 0.30 | 0.800 | 0.0200 | 0.800 | 0.400 | 1.000 | 0.0100 | 550.0 | 1.82x "
        "| 0.300 | 0.300 |"
        in lines
    )
    assert "| full | - | - | 0.900 |" in md
    assert "| config | single | pronoun |" in md and "| blend-epic@0.1 | 0.600 | 0.500 |" in md


def test_files_written(tmp_path: Path) -> None:
    paths = write_report(_report(), tmp_path / "o")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "fidelity_vs_compute.png",
        "quality_vs_ttft.png",
        "table.csv",
        "table.md",
    ]
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 7 and rows[0]["selector"] == "" and rows[3]["ratio"] == "0.1"
    assert rows[3]["quality_single"] == "0.6" and rows[3]["quality_pronoun"] == "0.5"
    assert paths["png"].stat().st_size > 10_000


def test_cli_bench_quality(model_dir, tmp_path: Path, capsys) -> None:
    out, js = tmp_path / "out", tmp_path / "q.json"
    rc = main(["bench", "quality", "--dataset", "synthetic", "--model", str(model_dir("llama")),
               "--limit", "1",
               "--modes", "full,reuse", "--max-new-tokens", "2", "--no-warmup", "--out-dir",
               str(out),
               "--json", str(js)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| full | - | - |" in printed and "| reuse | - | - |" in printed
    assert {p.name for p in (out / "synthetic").iterdir()} == {
        "table.md", "table.csv", "quality_vs_ttft.png", "fidelity_vs_compute.png"}
    assert [(r["dataset"], r["mode"]) for r in json.loads(js.read_text())] == [
        ("synthetic", "full"),
        ("synthetic", "reuse"),
    ]


def test_cli_reports_bad_arguments(tmp_path: Path, capsys) -> None:
    rc = main(["bench", "quality", "--dataset", str(tmp_path / "missing.json"), "--out-dir",
               str(tmp_path)])
    assert rc == 2 and "missing.json" in capsys.readouterr().err
