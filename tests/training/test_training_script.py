"""scripts/train_demo_model.py: the pieces the shipped model's training depends on."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from demo_facts import read_facts
from demo_tokenizer import build_tokenizer
from training_data import generate_question_groups

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "training" / "train_demo_model.py"


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
    small = train.build_model(train.TrainConfig(hidden=32, heads=4, kv_heads=2, intermediate=64,
                                                layers=2), tok)
    small.save_pretrained(tmp_path)
    cfg = train.TrainConfig(init=str(tmp_path), grow="0,new,1,new")
    old, grown = train.load_model(train.TrainConfig(init=str(tmp_path))), train.load_model(cfg)
    assert grown.config.num_hidden_layers == 4
    ids = torch.randint(3, len(tok), (2, 40))
    with torch.no_grad():
        assert torch.allclose(old(ids).logits, grown(ids).logits, atol=1e-5)
    assert torch.equal(grown.model.layers[2].self_attn.q_proj.weight,
                       old.model.layers[1].self_attn.q_proj.weight)
    # a new layer: identity block
    assert grown.model.layers[1].mlp.down_proj.weight.abs().sum() == 0
    with pytest.raises(ValueError, match="outside"):
        train.load_model(train.TrainConfig(init=str(tmp_path), grow="0,5"))
    for bad in (dict(grow="0,new"), dict(init="x", grow="0,later"), dict(threads=0)):
        with pytest.raises(ValueError):
            train.TrainConfig(**bad)


def test_evidence_is_the_bridge_facts_of_each_two_passage_question(train, tok):
    seen = {"comparison": 0, "multihop": 0}
    for group in generate_question_groups(30, 7, (2, 6), 24):
        ids, labels, _, evidence = train.encode_group(tok, group, 10_000)
        asked = [ex for ex in group if ex.kind in seen]
        queries = sorted({q for q, _, _ in evidence})
        assert len(queries) == len(asked)
        for ex, query in zip(asked, queries):
            # the query predicts the answer
            assert tok.decode([labels[query + 1]]) == ex.answers[0].split()[0]
            facts = read_facts(ex.chunks)
            got = [(h, tok.decode([ids[k]]), k) for q, h, k in evidence if q == query]
            # head 0: the first-named person's year, head 1: the other's
            if ex.kind == "comparison":
                a, b = re.match(r"Who is \w+, (\w+ \w+) or (\w+ \w+)\?", ex.question).groups()
                assert [(h, t) for h, t, _ in got] == [(0, facts[a]["year"]), (1, facts[b]["year"])]
            else:
                person = re.search(r"employer of (\w+ \w+)", ex.question).group(1)
                assert [(h, t) for h, t, _ in got] == [(0, facts[person]["employer"])]
                window = tok.decode(ids[max(0, got[0][2] - 40): got[0][2]])
                assert person.split()[0] in window  # in the person's passage, not the company's
            seen[ex.kind] += 1
    assert min(seen.values()) > 10


def test_a_few_steps_with_every_loss_run_and_report(train, tok, tmp_path):
    cfg = train.TrainConfig(steps=3, hidden=32, heads=4, kv_heads=2, intermediate=64, layers=2,
                            eval_n=8,
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


def test_year_axis_orders_year_embeddings_along_one_direction(train, tok):
    model = train.build_model(train.TrainConfig(hidden=32, heads=4, kv_heads=2, intermediate=64,
                                                layers=2), tok)
    before = model.get_input_embeddings().weight.clone()
    assert train.add_year_axis(model, tok, 3.0, seed=0) == 150  # 1850-1999
    delta = (model.get_input_embeddings().weight - before).detach()  # [V, H]
    vocab = tok.get_vocab()
    years = sorted((int(w), i) for w, i in vocab.items() if w.isdigit() and len(w) == 4)
    axis = delta[years[-1][1]] / delta[years[-1][1]].norm()
    along = [float(delta[i] @ axis) for _, i in years]
    assert along == sorted(along) and abs(along[0] + 3.0) < 1e-4 and abs(along[-1] - 3.0) < 1e-4
    others = [i for w, i in vocab.items() if not (w.isdigit() and len(w) == 4)]
    assert delta[others].abs().max() == 0  # nothing else moves
