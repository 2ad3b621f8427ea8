"""The training script's corpus helpers: question groups share their passages and their answers
are derivable by the independent passage reader; the word-level tokenizer covers the corpus."""

from __future__ import annotations

import pytest

from blendrag_demo.corpus import (
    QAExample,
    encode_pieces,
    encode_prompt,
    generate_examples,
    prompt_pieces,
)
from demo_facts import answer_from_facts
from demo_tokenizer import build_tokenizer
from training_data import generate_question_groups


@pytest.fixture(scope="module")
def examples() -> list[QAExample]:
    return generate_examples(1500, seed=11, num_chunks=(1, 6))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_answers_derivable_by_independent_reader(examples: list[QAExample]) -> None:
    for ex in examples:
        assert answer_from_facts(ex.chunks, ex.question) == ex.answers[0], ex


def test_group_answers_derivable() -> None:
    for group in generate_question_groups(150, seed=5, num_chunks=(2, 6)):
        for ex in group:
            assert ex.chunks == group[0].chunks
            assert answer_from_facts(ex.chunks, ex.question) == ex.answers[0], ex


def test_seeds_reproducible() -> None:
    assert generate_examples(50, seed=4) == generate_examples(50, seed=4)
    assert generate_examples(50, seed=4) != generate_examples(50, seed=5)
    assert generate_question_groups(10, seed=4) == generate_question_groups(10, seed=4)


def test_group_heads_equal_examples() -> None:
    heads = [g[0] for g in generate_question_groups(30, seed=8, num_chunks=(2, 5),
                                                    questions_per_group=5)]
    assert heads == generate_examples(30, seed=8, num_chunks=(2, 5))


def test_piecewise_encoding_has_no_unknown_words(tok, examples: list[QAExample]) -> None:
    for ex in examples[:300]:
        prefix, chunks, suffix = encode_pieces(tok, prompt_pieces(ex.chunks, ex.question))
        assert prefix[0] == tok.bos_token_id and tok.bos_token_id not in prefix[1:]
        ids = encode_prompt(tok, ex.chunks, ex.question)
        assert ids == prefix + [t for c in chunks for t in c] + suffix
        assert tok.unk_token_id not in ids
        for answer in ex.answers:
            assert tok.unk_token_id not in tok(answer, add_special_tokens=False)["input_ids"]
