"""Labelled questions as JSON lines (``blendrag.calibration.qa_file``): read in order, a line
without passages given the corpus's nearest, anything else an error naming its line."""

from __future__ import annotations

import json

import pytest

from blendrag.calibration.qa_file import QAItem, nearest, read_qa

CORPUS = ["Lena Park was born in Oslo and works as a nurse.",
          "The river runs through the old town.",
          "Omar Diaz works for a company called Zentra.",
          "Zentra is based in Lyon."]


def _file(tmp_path, lines):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def test_questions_are_read_in_order_with_their_answers_and_passages(tmp_path):
    path = _file(tmp_path, [{"question": "Where was Lena Park born?", "answer": "Oslo",
                             "passages": CORPUS[:2]},
                            "",  # a blank line is skipped
                            {"question": "Where is Zentra based?", "answer": ["Lyon", "lyon"],
                             "passages": CORPUS[2:]}])
    assert read_qa(path) == [QAItem("Where was Lena Park born?", ("Oslo",), tuple(CORPUS[:2])),
                             QAItem("Where is Zentra based?", ("Lyon", "lyon"),
                                    tuple(CORPUS[2:]))]


def test_a_question_without_passages_takes_the_corpus_passages_nearest_to_it(tmp_path):
    assert nearest("Where is Zentra based?", CORPUS, 2) == [CORPUS[3], CORPUS[2]]
    path = _file(tmp_path, [{"question": "Where was Lena Park born?", "answer": "Oslo"}])
    assert read_qa(path, CORPUS, per_prompt=3)[0].passages == (CORPUS[0], CORPUS[1],
                                                               CORPUS[2])
    with pytest.raises(ValueError, match=r"line 1: no \"passages\"; give them, or --corpus"):
        read_qa(path)


@pytest.mark.parametrize("line,match", [
    ("{not json", r"line 2: not JSON"),
    ('["a list"]', r"line 2: not a JSON object"),
    ({"answer": "Oslo", "passages": ["p"]}, r"line 2: no \"question\""),
    ({"question": "  ", "answer": "Oslo", "passages": ["p"]}, r"line 2: no \"question\""),
    ({"question": "Q?", "passages": ["p"]}, r"line 2: no \"answer\""),
    ({"question": "Q?", "answer": [], "passages": ["p"]}, r"line 2: no \"answer\""),
    ({"question": "Q?", "answer": 3, "passages": ["p"]}, r"line 2: no \"answer\""),
    ({"question": "Q?", "answer": "A", "passages": "p"}, r"line 2: \"passages\" must be"),
    ({"question": "Q?", "answer": "A", "passages": ["p", ""]}, r"line 2: \"passages\" must")])
def test_a_bad_line_is_an_error_naming_it(tmp_path, line, match):
    good = {"question": "Q?", "answer": "A", "passages": ["p"]}
    with pytest.raises(ValueError, match=match):
        read_qa(_file(tmp_path, [good, line]))


def test_an_empty_or_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="has no questions"):
        read_qa(_file(tmp_path, ["", "  "]))
    with pytest.raises(ValueError, match="no file there"):
        read_qa(tmp_path / "nowhere.jsonl")
