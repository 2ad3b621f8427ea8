"""`blendrag calibrate` and `precompute --calibrate` end to end on a tiny model: the record kept
beside the store, read back by an engine on that store and by `cache stats`; bad input is one
error line and exit status 2 before any model work."""

from __future__ import annotations

import json
import os

import pytest

from blendrag import BlendConfig, BlendEngine
from blendrag.cli import main
from blendrag.store import StoreConfig, TieredKVStore
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")
CORPUS = [p + f"Entry {i}." for i in range(3) for p in PASSAGES]  # 12 passages


def _corpus(tmp_path, texts=CORPUS):
    f = tmp_path / "corpus.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return f


def _args(model, store, corpus) -> list[str]:
    return ["calibrate", "--model", str(model), "--device", "cpu", "--store-dir", str(store),
            "--corpus", str(corpus), "--prompts", "3", "--per-prompt", "2", "--ratios", "0.3,1",
            "--answer-tokens", "6", "--no-progress"]


def test_calibrate_keeps_a_record_that_the_default_config_then_runs(model_dir, tmp_path,
                                                                     capsys):
    store = tmp_path / "kv"
    assert main([*_args(model_dir("llama"), store, _corpus(tmp_path)), "--answer-kl",
                 "1e-9", "--same-answer", "1"]) == 0
    out = capsys.readouterr().out
    assert "Ran: flow `integration`" in out and "chunk prefix ''" in out
    assert "chosen: preview at 1 " in out and "recorded in" in out
    assert "runs the exact full prefill instead" in out
    assert len(list((store / "calibrations").glob("*.json"))) == 1
    with TieredKVStore(StoreConfig(disk_dir=store)) as kv:
        engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", store=kv,
                                             chunk_prefix="")
        assert engine.calibration is not None and engine.calibration.ratio == 1.0
        layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
        stats = engine.prefill(layout, BlendConfig()).stats
        # ratio 1.0 is a full prefill's rows: the exact full prefill runs, sooner
        assert stats.mode == "full" and stats.calibration.ratio == 1.0
    assert main(["cache", "stats", "--store-dir", str(store)]) == 0
    assert "the default config runs a full prefill (only ratio 1.0" in capsys.readouterr().out


def test_the_json_record_and_the_engine_flow(model_dir, tmp_path, capsys):
    store = tmp_path / "kv"
    argv = [*_args(model_dir("llama"), store, _corpus(tmp_path)), "--flow", "engine",
            "--answer-kl", "-1", "--same-answer", "0", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ratio"] == 0.3 and record["prompts"] == 3  # a target any ratio meets
    assert record["flow"].startswith("flow `engine`")
    assert [p["ratio"] for p in record["frontier"]] == [0.3, 1.0]


@pytest.mark.parametrize("case", ["few", "unwritable", "missing", "bad-target"])
def test_bad_input_is_one_error_line_and_exit_2(model_dir, tmp_path, capsys, case):
    corpus, store, extra = _corpus(tmp_path), tmp_path / "kv", []
    if case == "few":
        corpus = _corpus(tmp_path, CORPUS[:1])
    elif case == "unwritable":
        if os.geteuid() == 0:
            store = tmp_path / "a-file"
            store.write_text("")  # a file where the store's folder should be
        else:
            store.mkdir()
            store.chmod(0o500)
    elif case == "missing":
        corpus = tmp_path / "nowhere.jsonl"
    else:
        extra = ["--answer-kl", "-1", "--same-answer", "-1"]
    # a model that does not exist: an error must come before loading it
    argv = [*_args(tmp_path / "no-model", store, corpus), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("blendrag calibrate: error:")
    expected = {"few": "at least 2 passages", "unwritable": "cannot be written",
                "missing": "no file at", "bad-target": "same_answer, answer_kl or both"}
    assert expected[case] in err[0]


def test_precompute_then_calibrate(model_dir, tmp_path, capsys):
    store = tmp_path / "kv"
    argv = ["precompute", "--model", str(model_dir("llama")), "--device", "cpu", "--store-dir",
            str(store), "--jsonl", str(_corpus(tmp_path)), "--chunk-prefix", "",
            "--no-progress", "--calibrate"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Ran: flow `integration`" in err and "24 prompts" in err
    assert len(list((store / "calibrations").glob("*.json"))) == 1


def test_calibrating_keeps_the_stores_disk_budget(model_dir, tmp_path, capsys):
    """calibrate has no --disk-bytes: it opens the store with the budget the store has, where
    the default (64 GiB) replaced it, and evicted a store larger than that down to it."""
    from blendrag.store import DiskTier

    store = tmp_path / "kv"
    precompute = ["precompute", "--model", str(model_dir("llama")), "--device", "cpu",
                  "--store-dir", str(store), "--jsonl", str(_corpus(tmp_path)),
                  "--chunk-prefix", "", "--no-progress", "--disk-bytes", "3M"]
    assert main(precompute) == 0
    argv = [*_args(model_dir("llama"), store, _corpus(tmp_path)), "--budget", "0.001"]
    assert main(argv) == 0
    capsys.readouterr()
    tier = DiskTier(store, budget_bytes=None, tidy=False)
    assert tier.budget_bytes == 3 << 20
    tier.close()


def test_the_budget_says_what_it_allowed_and_progress_is_removed_once_kept(model_dir, tmp_path,
                                                                         capsys):
    store = tmp_path / "kv"
    argv = [*_args(model_dir("llama"), store, _corpus(tmp_path)), "--budget", "0.001"]
    argv.remove("--no-progress")
    assert main(argv) == 0
    captured = capsys.readouterr()
    # one prompt measured, then its pace leaves no room for another
    assert "3 prompts x 1 ratios measured" in captured.err  # said before it starts
    assert "needs at least 15 prompts" in captured.err
    assert "1 prompts (the time budget allowed 1 of the 3 asked for)" in captured.out
    assert not list((store / "calibration-progress").glob("*.jsonl"))  # record kept: gone


@pytest.mark.parametrize("text,seconds", [("600", 600.0), ("90s", 90.0), ("10m", 600.0),
                                          ("1.5h", 5400.0), ("0", 0.0)])
def test_a_budget_is_read_as_a_time(text, seconds):
    from blendrag.cli.calibrate import duration

    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["ten minutes", "-5m", "inf", "nan"])
def test_a_budget_that_is_not_a_time_is_refused(text):
    import argparse

    from blendrag.cli.calibrate import duration

    with pytest.raises(argparse.ArgumentTypeError, match="time"):
        duration(text)


def test_precompute_calibrate_refuses_too_few_passages_before_the_job(model_dir, tmp_path,
                                                                       capsys):
    """Three passages cannot make prompts of four: said before any chunk is computed, where it
    stopped the job after storing every chunk, without its summary."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("one", "two", "three")))
    argv = ["precompute", "--model", str(model_dir("llama")), "--device", "cpu", "--store-dir",
            str(tmp_path / "kv"), "--jsonl", str(corpus), "--chunk-prefix", "",
            "--no-progress", "--calibrate"]
    assert main(argv) == 2
    assert "at least 4 passages" in capsys.readouterr().err
    assert not (tmp_path / "kv").exists()
