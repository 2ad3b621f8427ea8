"""The synthetic QA corpus: answers in their support passages, kinds mixed, arguments checked."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from blendrag_demo.corpus import (
    CROSS_CHUNK_KINDS,
    KINDS,
    PREFIX,
    QAExample,
    exact_match,
    format_chunk,
    format_suffix,
    generate_examples,
    normalize_answer,
    prompt_pieces,
)


@pytest.fixture(scope="module")
def examples() -> list[QAExample]:
    return generate_examples(1500, seed=11, num_chunks=(1, 6))


def test_answer_in_support_passages(examples: list[QAExample]) -> None:
    for ex in examples:
        if ex.kind == "comparison":
            continue
        assert any(re.search(rf"\b{ex.answers[0]}\b", ex.chunks[i]) for i in ex.support), ex


def test_pronoun_questions_need_two_passages(examples: list[QAExample]) -> None:
    pronoun = [ex for ex in examples if ex.kind == "pronoun"]
    assert pronoun
    for ex in pronoun:
        named, cont = ex.support
        assert cont == named + 1
        name = re.search(r"(?:born|enjoy)",
                         ex.question) and ex.question.split(" was ")[-1].split(" enjoy")[0]
        person = re.search(r"([A-Z][a-z]+ [A-Z][a-z]+)", ex.question).group(1)
        assert person in ex.chunks[named] and person not in ex.chunks[cont], name
        assert re.match(r"(She|He) ", ex.chunks[cont])
        assert ex.answers[0] in ex.chunks[cont] and ex.answers[0] not in ex.chunks[named]


def test_multihop_and_comparison_span_two_passages(examples: list[QAExample]) -> None:
    for ex in examples:
        if ex.kind in ("multihop", "comparison"):
            assert len(set(ex.support)) >= 2, ex
        if ex.kind == "comparison":
            a, b = re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", ex.question)
            assert [i for i, c in enumerate(ex.chunks) if a in c] != [
                i for i, c in enumerate(ex.chunks) if b in c
            ]


def test_continuation_passage_follows_its_person(examples: list[QAExample]) -> None:
    for ex in examples:
        for i, chunk in enumerate(ex.chunks):
            if re.match(r"(She|He) ", chunk):
                assert i > 0 and re.match(r"[A-Z][a-z]+ [A-Z][a-z]+ (is|comes)", ex.chunks[i - 1])


def test_kinds_mix(examples: list[QAExample]) -> None:
    kinds = Counter(ex.kind for ex in examples)
    assert set(kinds) == set(KINDS)
    cross = sum(kinds[k] for k in CROSS_CHUNK_KINDS)
    assert cross / len(examples) >= 0.4
    assert min(kinds.values()) / len(examples) >= 0.1


def test_distractors_present() -> None:
    for ex in generate_examples(300, seed=3, num_chunks=(4, 6)):
        assert len(ex.chunks) - len(set(ex.support)) >= 1
        assert 4 <= len(ex.chunks) <= 6


def test_passage_lengths(examples: list[QAExample]) -> None:
    lengths = [len(c.split()) for ex in examples for c in ex.chunks]
    assert 12 <= min(lengths) and max(lengths) <= 60


def test_fixed_chunk_count_and_kind_weights() -> None:
    exs = generate_examples(40, seed=1, num_chunks=3, kind_weights={"pronoun": 1.0})
    assert all(len(ex.chunks) == 3 and ex.kind == "pronoun" for ex in exs)
    single = generate_examples(10, seed=1, num_chunks=1)
    assert all(ex.kind == "single" and len(ex.chunks) == 1 for ex in single)


@pytest.mark.parametrize(
    "kwargs",
    [{"n": -1, "seed": 0}, {"n": 1, "seed": 0, "num_chunks": 0},
     {"n": 1, "seed": 0, "num_chunks": (5, 4)},
     {"n": 1, "seed": 0, "kind_weights": {"bogus": 1.0}},
     {"n": 1, "seed": 0, "kind_weights": {"single": 0.0}}],
)
def test_invalid_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate_examples(**kwargs)


def test_qaexample_validation() -> None:
    with pytest.raises(ValueError):
        QAExample([], "q?", ["a"], "single")
    with pytest.raises(ValueError):
        QAExample(["c"], "q?", [], "single")
    with pytest.raises(ValueError):
        QAExample(["c"], "q?", ["a"], "bogus")
    with pytest.raises(ValueError):
        QAExample(["c"], "q?", ["a"], "single", support=[3])


def test_normalize_and_exact_match() -> None:
    assert normalize_answer("  The Lena-Park. ") == "lenapark"
    assert exact_match("an Engineer.", ["engineer"])
    assert not exact_match("Oslo Lima", ["Oslo"])


def test_prompt_pieces_format() -> None:
    pieces = prompt_pieces(["A b.", "C d."], "Who?")
    assert pieces.prefix == PREFIX
    assert pieces.chunks == [format_chunk("A b."), format_chunk("C d.")] == ["A b.\n", "C d.\n"]
    assert pieces.suffix == format_suffix("Who?") == "Question: Who?\nAnswer:"


def test_check_demo_model_reports_missing(tmp_path) -> None:
    from blendrag_demo import check_demo_model

    with pytest.raises(FileNotFoundError):
        check_demo_model(tmp_path)
