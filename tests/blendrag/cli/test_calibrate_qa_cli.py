"""`blendrag calibrate --qa FILE` end to end on a tiny model: labelled questions answered with
full prefill and blend, the record of the target met kept beside the store and run by the
default config; a bad file is one error line and exit status 2 before any model work."""

from __future__ import annotations

import json

import pytest

from blendrag import BlendEngine
from blendrag.cli import main
from blendrag.store import StoreConfig, TieredKVStore
from helpers.tiny import PASSAGES

pytestmark = pytest.mark.usefixtures("one_thread")
QUESTIONS = [{"question": f"Which passage mentions item {i}?", "answer": f"zqx{i}",
              "passages": [PASSAGES[i % 4], PASSAGES[(i + 1) % 4]]} for i in range(10)]


def _qa(tmp_path, lines=QUESTIONS):
    f = tmp_path / "qa.jsonl"
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return f


def _args(model, store, qa) -> list[str]:
    return ["calibrate", "--model", str(model), "--device", "cpu", "--store-dir", str(store),
            "--qa", str(qa), "--ratios", "0.3,1", "--answer-tokens", "4", "--chunk-prefix", "",
            "--no-progress"]


def test_calibrate_qa_keeps_the_ratio_within_the_margin_for_the_default_config(
        model_dir, tmp_path, capsys):
    store = tmp_path / "kv"
    # a random model names no gold answer: full's quality and blend's are both 0
    assert main([*_args(model_dir("llama"), store, _qa(tmp_path)), "--margin", "0"]) == 0
    out = capsys.readouterr().out
    assert "Ran: flow `integration`" in out and "(10 questions, passages id" in out
    assert "answer quality: contains against the gold answers" in out
    assert "full prefill's mean 0.00" in out
    assert "chosen: preview at 0.3 (quality 0.00 against full prefill's 0.00, difference " \
           "bound +0.00 >= -0" in out and "target met: answer quality (contains)" in out
    with TieredKVStore(StoreConfig(disk_dir=store)) as kv:
        engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", store=kv,
                                             chunk_prefix="")
        assert engine.calibration is not None and engine.calibration.ratio == 0.3
        assert engine.calibration.target["kind"] == "answer_quality"
    assert not list((store / "calibration-progress").glob("*.jsonl"))  # kept: gone


def test_the_json_record_says_the_target_and_the_budget_what_it_allowed(model_dir, tmp_path,
                                                                        capsys):
    argv = [*_args(model_dir("llama"), tmp_path / "kv", _qa(tmp_path)), "--flow", "engine",
            "--json", "--budget", "0.001"]
    argv.remove("--no-progress")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "calibrate: 10 questions x 1 ratios measured" in captured.err
    assert "at most 0.05 below full prefill's at its 90% bound" in captured.err
    record = json.loads(captured.out)
    # one question, then its pace leaves no room: no bound, only the full prefill
    assert record["prompts"] == 1 and record["ratio"] == 1.0
    assert record["target"]["kind"] == "answer_quality" and record["target"]["questions"] == 1
    assert [p["quality_bound"] for p in record["frontier"]] == [None, 0.0]


def test_questions_without_passages_take_the_corpus(model_dir, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in PASSAGES))
    bare = [{"question": q["question"], "answer": q["answer"]} for q in QUESTIONS[:2]]
    argv = [*_args(model_dir("llama"), tmp_path / "kv", _qa(tmp_path, bare)), "--corpus",
            str(corpus), "--per-prompt", "2"]
    assert main(argv) == 0
    assert "(2 questions, passages id" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["bad-line", "no-answer", "empty", "no-input", "margin"])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, case):
    lines: list = list(QUESTIONS)
    extra: list[str] = []
    if case == "bad-line":
        lines[2] = "{broken"
    elif case == "no-answer":
        lines[3] = {"question": "Q?", "passages": ["p"]}
    elif case == "empty":
        lines = []
    elif case == "margin":
        extra = ["--margin", "2"]
    # a model that does not exist: the error must come before loading it
    argv = [*_args(tmp_path / "no-model", tmp_path / "kv", _qa(tmp_path, lines)), *extra]
    if case == "no-input":
        argv = argv[:argv.index("--qa")] + argv[argv.index("--qa") + 2:]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("blendrag calibrate: error:")
    expected = {"bad-line": "qa.jsonl line 3: not JSON",
                "no-answer": "qa.jsonl line 4: no \"answer\"", "empty": "has no questions",
                "no-input": "give --corpus (your passages), or --qa", "margin": "margin must be"}
    assert expected[case] in err[0]
