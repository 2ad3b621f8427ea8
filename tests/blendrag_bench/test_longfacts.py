"""The long-context fact set: deterministic items of real-text passages whose facts carry the
gold answer, one- and two-passage questions."""

from __future__ import annotations

import json

import pytest

from blendrag_bench.datasets import MUSIQUE_PATH
from blendrag_bench.longfacts import load_longfacts
from blendrag_bench.named_datasets import dataset_name, load_dataset


def test_items_are_deterministic_and_offsets_slice_one_sequence() -> None:
    a = load_longfacts(limit=6)
    assert a == load_longfacts(limit=6)
    assert load_longfacts(limit=3, offset=3) == a[3:]
    assert load_dataset("longfacts", limit=6) == a and dataset_name("longfacts") == "longfacts"
    assert len(load_longfacts()) == 40


def test_each_item_states_its_answer_in_the_passages_the_question_needs() -> None:
    records = json.loads(MUSIQUE_PATH.read_text(encoding="utf-8"))
    musique = "\n".join(" ".join(c["text"].split()) for r in records for c in r["ctxs"])
    items = load_longfacts(limit=30)
    assert {i.kind for i in items} == {"one", "two"}
    for item in items:
        assert len(item.chunks) == 6 and item.metric == "contains"
        gold = item.answers[0]
        name = item.suffix.split(" born?")[0].split("In which city was ")[-1] \
            if item.kind == "one" else item.suffix.split("company that ")[1].split(" works")[0]
        facts = [c for c in item.chunks if c.startswith((name, "The company "))]
        assert len(facts) == (1 if item.kind == "one" else 2)
        assert any(f"born in {gold}." in c or f"is based in {gold}." in c for c in facts)
        for chunk in item.chunks:  # the rest of every passage is real MuSiQue text
            body = chunk.split(". ", 1)[1] if chunk in facts else chunk
            assert " ".join(body.split()[:8]) in musique
            assert len(body.split()) <= 200


def test_bad_arguments() -> None:
    for bad in (dict(passages=1), dict(words=5), dict(offset=-1), dict(limit=-2)):
        with pytest.raises(ValueError):
            load_longfacts(**bad)
