"""scripts/train_demo_model.py: the pieces the shipped model's training depends on."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from blendrag.demo.corpus import generate_question_groups, read_facts
from blendrag.demo.tokenizer import build_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_demo_model.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("train_demo_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_demo_model"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_grown_model_computes_what_the_old_one_did(train, tok, tmp_path):
    small = train.build_model(train.TrainConfig(hidden=32, heads=4, kv_heads=2, intermediate=64, layers=2), tok)
    small.save_pretrained(tmp_path)
    cfg = train.TrainConfig(init=str(tmp_path), grow="0,new,1,new")
    old, grown = train.load_model(train.TrainConfig(init=str(tmp_path))), train.load_model(cfg)
    assert grown.config.num_hidden_layers == 4
    ids = torch.randint(3, len(tok), (2, 40))
    with torch.no_grad():
        assert torch.allclose(old(ids).logits, grown(ids).logits, atol=1e-5)
    assert torch.equal(grown.model.layers[2].self_attn.q_proj.weight, old.model.layers[1].self_attn.q_proj.weight)
    assert grown.model.layers[1].mlp.down_proj.weight.abs().sum() == 0  # a new layer: identity block
    with pytest.raises(ValueError, match="outside"):
        train.load_model(train.TrainConfig(init=str(tmp_path), grow="0,5"))
    for bad in (dict(grow="0,new"), dict(init="x", grow="0,later"), dict(threads=0)):
        with pytest.raises(ValueError):
            train.TrainConfig(**bad)


def test_evidence_is_the_bridge_fact_of_each_two_passage_question(train, tok):
    seen = {"comparison": 0, "multihop": 0}
    for group in generate_question_groups(30, 7, (2, 6), 24):
        ids, labels, _, evidence = train.encode_group(tok, group, 10_000)
        asked = [ex for ex in group if ex.kind in seen]
        assert len(evidence) == len(asked)
        for ex, (query, key) in zip(asked, evidence):
            assert tok.decode([labels[query + 1]]) == ex.answers[0].split()[0]  # the query predicts the answer
            facts = read_facts(ex.chunks)
            if ex.kind == "comparison":
                assert tok.decode([ids[key]]) == facts[ex.answers[0]]["year"]
            else:
                person = re.search(r"employer of (\w+ \w+)", ex.question).group(1)
                assert tok.decode([ids[key]]) == facts[person]["employer"]
                window = tok.decode(ids[max(0, key - 40): key])
                assert person.split()[0] in window  # in the person's passage, not the company's
            seen[ex.kind] += 1
    assert min(seen.values()) > 10


def test_a_few_steps_with_every_loss_run_and_report(train, tok, tmp_path):
    cfg = train.TrainConfig(steps=3, hidden=32, heads=4, kv_heads=2, intermediate=64, layers=2, eval_n=8,
                            eval_every=3, evidence_weight=1.0, evidence_layer=0)
    threads = torch.get_num_threads()
    try:
        summary = train.train(cfg, tmp_path / "out", log_every=1)
    finally:
        torch.set_num_threads(threads)  # train() pins its own thread count
    assert summary["arch"]["num_hidden_layers"] == 2 and len(summary["history"]) == 1
    text = (tmp_path / "out" / "TRAINING.md").read_text()
    assert "2 layers, hidden 32" in text and "1 CPU thread(s)" in text
    assert (tmp_path / "out" / "model.safetensors").is_file()
