"""Answer metrics against hand-computed values (LongBench's definitions)."""

from __future__ import annotations

import math

import pytest
import torch

from blendrag.eval.metrics import (
    exact_match,
    first_token_agrees,
    first_token_kl,
    normalize_answer,
    qa_f1_score,
    rouge_l,
    rouge_l_score,
    score,
    token_f1,
)


@pytest.mark.parametrize("text, expected", [
    # lower -> drop punctuation (the hyphen too, joining the words) -> drop articles
    # -> collapse spaces
    ("The  Quick, Brown-Fox!", "quick brownfox"),
    ("An apple a day", "apple day"),
    ("theater another anthem", "theater another anthem"),  # articles only as whole words
    ("  Exeter\tCollege.\n", "exeter college"),
    ("A", ""),
])
def test_normalize_answer_longbench_examples(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_qa_f1_partial_overlap() -> None:
    # pred "The cat sat." -> [cat, sat]; gold "a cat sat on mat" -> [cat, sat, on, mat]
    # common = 2, P = 2/2 = 1, R = 2/4 = 0.5, F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    assert qa_f1_score("The cat sat.", ["a cat sat on mat"]) == pytest.approx(2 / 3)


def test_qa_f1_max_over_golds() -> None:
    # vs "London": 0; vs "paris, France" -> [paris, france]: P = 1/1, R = 1/2, F1 = 2/3
    assert qa_f1_score("Paris", ["London", "paris, France"]) == pytest.approx(2 / 3)
    assert qa_f1_score("Paris", "Paris") == 1.0


def test_qa_f1_counts_repeated_tokens_once_per_gold_occurrence() -> None:
    # pred [cat, cat, cat], gold [cat]: common = min(3, 1) = 1, P = 1/3, R = 1,
    # F1 = (2/3) / (4/3) = 0.5
    assert token_f1("the the cat cat cat", "cat") == pytest.approx(0.5)


def test_qa_f1_empty_and_no_overlap() -> None:
    assert qa_f1_score("", ["cat"]) == 0.0
    assert qa_f1_score("dog", ["cat"]) == 0.0
    with pytest.raises(ValueError):
        qa_f1_score("cat", [])


def test_exact_match() -> None:
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["eiffel tower", "paris"]) == 0.0
    assert exact_match("paris", ["eiffel tower", "Paris!"]) == 1.0


def test_rouge_l_hand_computed() -> None:
    # [cat, sat, on, mat] vs [cat, lay, on, mat]: LCS = (cat, on, mat) = 3, P = R = 3/4, F = 0.75
    assert rouge_l("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(0.75)
    # [police, killed, gunman] vs [gunman, police, killed]: LCS = 2, P = R = 2/3
    assert rouge_l("police killed the gunman", "the gunman police killed") == pytest.approx(2 / 3)
    # reversed order: LCS = 1, P = R = 1/4
    assert rouge_l("w x y z", "z y x w") == pytest.approx(0.25)
    # pred 2 tokens, ref 4, LCS 2: P = 1, R = 0.5, F = 2/3
    assert rouge_l_score("x z", ["q", "w x y z"]) == pytest.approx(2 / 3)
    assert rouge_l("", "cat") == 0.0


def test_score_dispatch() -> None:
    assert score("qa_f1", "The cat sat.", ["a cat sat on mat"]) == pytest.approx(2 / 3)
    assert score("rouge_l", "w x y z", ["z y x w"]) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        score("bleu", "a", ["a"])


def test_first_token_kl_hand_computed() -> None:
    p = torch.log(torch.tensor([0.5, 0.5]))
    q = torch.log(torch.tensor([0.25, 0.75]))
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    assert first_token_kl(p, q) == pytest.approx(0.5 * math.log(4 / 3))
    assert first_token_kl(p, p) == 0.0
    assert first_token_kl(q, q + 7.0) == pytest.approx(0.0, abs=1e-12)  # softmax is shift-invariant


def test_first_token_kl_with_masked_tokens() -> None:
    inf = float("inf")
    # p = [1, 0], q = [0.5, 0.5]: KL = 1 * ln(1 / 0.5) = ln 2; the zero-mass token adds nothing
    assert first_token_kl(torch.tensor([0.0, -inf]),
                          torch.tensor([0.0, 0.0])) == pytest.approx(math.log(2))
    assert first_token_kl(torch.tensor([0.0, 0.0]), torch.tensor([0.0, -inf])) == inf
    with pytest.raises(ValueError):
        first_token_kl(torch.zeros(3), torch.zeros(4))


def test_first_token_agreement() -> None:
    assert first_token_agrees(torch.tensor([0.1, 2.0, 0.3]), torch.tensor([0.0, 5.0, 4.0]))
    assert not first_token_agrees(torch.tensor([0.1, 2.0, 0.3]), torch.tensor([0.0, 1.0, 4.0]))

def test_a_speedup_below_one_is_never_called_faster():
    from blendrag.eval.metrics import speedup_words

    assert speedup_words(1.52) == "1.52x faster than full prefill"
    assert speedup_words(0.84) == "0.84x: slower than full prefill"
    assert speedup_words(1.0, than="prefix caching") == "1.00x: as fast as prefix caching"
    assert speedup_words(0.996) == "1.00x: as fast as full prefill"  # never "1.00x: slower"
    assert speedup_words(1.006) == "1.01x faster than full prefill"
