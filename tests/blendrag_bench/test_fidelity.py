"""The fidelity check on your own prompts: prompts files, the smallest ratio meeting a target,
and `blendrag bench fidelity` end to end on a tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from blendrag.cli import main
from blendrag.engine.caches.context import ChunkContext
from blendrag_bench.fidelity import (
    FidelityTarget,
    check_fidelity,
    load_prompts,
    smallest_ratios,
)
from blendrag_bench.quality import ConfigSummary, QualityReport

PROMPTS = [
    {"prefix": "Read: ", "chunks": ["alpha beta gamma. ", "delta epsilon. ", "zeta eta theta. "],
     "suffix": "Question: what? Answer:"},
    {"chunks": ["one two three. ", "four five six seven. "], "suffix": "Q: which? A:",
     "answers": ["five"]},
]


def _write(path: Path, records) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    return path


def test_load_prompts_reads_each_line(tmp_path: Path) -> None:
    items = load_prompts(_write(tmp_path / "p.jsonl", PROMPTS))
    assert [len(i.chunks) for i in items] == [3, 2]
    assert items[0].prefix == "Read: " and items[1].prefix == ""
    assert items[0].answers == () and items[1].answers == ("five",)
    assert len(load_prompts(tmp_path / "p.jsonl", limit=1)) == 1


@pytest.mark.parametrize("bad, words", [({"chunks": ["a"]}, "suffix"),
                                        ({"chunks": [], "suffix": "q"}, "chunks"),
                                        ("not json", "Expecting")])
def test_load_prompts_names_the_bad_line(tmp_path: Path, bad, words) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(PROMPTS[0]) + "\n" + (bad if isinstance(bad, str)
                                                      else json.dumps(bad)) + "\n")
    with pytest.raises(ValueError, match=rf"p.jsonl:2: .*{words}"):
        load_prompts(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no prompt"):
        load_prompts(path)


def _summary(selector, ratio, same, kl) -> ConfigSummary:
    return ConfigSummary(mode="blend", selector=selector, ratio=ratio, same_answer=same,
                         answer_kl=kl, quality=0.5, exact_match=0.0, first_token_agreement=1.0,
                         kl=0.0, ttft_s=1.0, speedup_vs_full=2.0, recompute_fraction=ratio,
                         compute_fraction=ratio, n=10)


def test_smallest_ratio_is_the_first_that_meets_both_bounds() -> None:
    rows = [_summary("preview", 0.5, 0.95, 0.010), _summary("preview", 0.2, 0.80, 0.030),
            _summary("preview", 0.3, 0.95, 0.025), _summary("epic", 0.2, 0.5, 0.2)]
    report = QualityReport(model="m", dataset="d", device="cpu", dtype="float32", items=10,
                           skipped=0, kinds=[], metrics=[], summaries=rows, examples=[])
    target = FidelityTarget(0.9, 0.02)
    assert smallest_ratios(report, target) == {"preview": 0.5, "epic": None}
    assert smallest_ratios(report, FidelityTarget(0.9, 0.03)) == {"preview": 0.3, "epic": None}
    for bad in (dict(same_answer=1.5), dict(answer_kl=-1.0), dict(answer_kl=math.nan)):
        with pytest.raises(ValueError):
            FidelityTarget(**bad)


def test_check_fidelity_on_a_tiny_model(engine_for, tmp_path: Path) -> None:
    engine = engine_for("llama", context=ChunkContext())
    items = load_prompts(_write(tmp_path / "p.jsonl", PROMPTS))
    strict = FidelityTarget(same_answer=1.0, answer_kl=1e-9)  # only an exact KV meets it
    check = check_fidelity(engine, items, ("cacheblend",), (0.2, 1.0), strict, max_new_tokens=4,
                           flow="engine")
    by = {s.label: s for s in check.report.summaries}
    assert set(by) == {"full", "reuse", "blend-cacheblend@0.2", "blend-cacheblend@1"}
    assert by["blend-cacheblend@1"].same_answer == 1.0
    assert by["blend-cacheblend@1"].answer_kl == pytest.approx(0.0, abs=1e-9)
    assert by["reuse"].answer_kl > 1e-9  # the stored rows differ from full prefill's
    assert check.smallest == {"cacheblend": 1.0}
    assert "cacheblend: 1 (same answer 1.00" in "\n".join(check.lines())
    assert math.isnan(by["full"].quality)  # a prompt without gold answers has no quality


def test_cli_bench_fidelity(model_dir, tmp_path: Path, capsys) -> None:
    prompts = _write(tmp_path / "p.jsonl", PROMPTS)
    model = str(model_dir("llama"))
    rc = main(["bench", "fidelity", "--prompts", str(prompts), "--model", model,
               "--selectors", "cacheblend", "--ratios", "0.5,1.0", "--max-new-tokens", "3",
               "--same-answer", "1.0", "--answer-kl", "0.5", "--show-answers"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"Quality vs TTFT: model `{model}`" in out
    assert "Ran: flow `integration` (LangChain's and LlamaIndex's BlendLLM)" in out
    assert "chunk KVs computed after the chunk prefix ''" in out
    assert "| quality (contains) |" in out
    assert "| blend | cacheblend | 1.00 | 1.000 | 0.0000 |" in out
    assert "Smallest ratio meeting same answer >= 1.00 and answer KL <= 0.5 (2 prompts):" in out
    answers = out[out.index("Answers:"):].splitlines()
    assert answers[1] == "prompt 1: 'Question: what? Answer:'"
    assert answers[6] == "prompt 2: 'Q: which? A:'; gold: five"
    assert [a.split(":")[0] for a in answers[7:11]] == [
        "  full", "  reuse", "  blend-cacheblend@0.5", "  blend-cacheblend@1"]
    assert answers[10].endswith("(= full)")
    rc = main(["bench", "fidelity", "--prompts", str(prompts), "--model", model,
               "--selectors", "cacheblend", "--ratios", "1.0", "--max-new-tokens", "2",
               "--flow", "engine", "--chunk-prefix", "Read: "])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Ran: flow `engine` (BlendEngine.ingest + build_prompt)" in out
    assert "chunk KVs computed after the chunk prefix 'Read: '" in out
    assert "Answers:" not in out
    rc = main(["bench", "fidelity", "--prompts", str(tmp_path / "none.jsonl")])
    assert rc == 2 and "none.jsonl" in capsys.readouterr().err
    rc = main(["bench", "fidelity", "--prompts", str(prompts), "--same-answer", "2"])
    assert rc == 2 and "same_answer" in capsys.readouterr().err
