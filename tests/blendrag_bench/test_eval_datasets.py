"""Dataset loaders: synthetic demo corpus, CacheBlend JSON, LongBench JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blendrag_bench.datasets import (  # noqa: E402
    CACHEBLEND_PREFIX,
    LONGBENCH_PREFIX,
    MUSIQUE_PATH,
    EvalItem,
    fit_tokens,
    load_cacheblend_json,
    load_longbench_jsonl,
    load_musique,
    load_synthetic,
    split_context,
)
from blendrag_bench.named_datasets import dataset_name, load_dataset  # noqa: E402
from blendrag_demo.corpus import KINDS, PREFIX, format_chunk, format_suffix

MUSIQUE = MUSIQUE_PATH
AUTHORS_SUFFIX = ("\n\nAnswer the question directly based on the given passages. Do NOT repeat the "
                  "question. The answer should be within 5 words. \nQuestion:{q}\nAnswer:")


def test_synthetic_items_use_the_demo_prompt() -> None:
    items = load_synthetic(3, num_chunks=(2, 3))
    assert len(items) == 3
    for item in items:
        assert item.prefix == PREFIX
        assert 2 <= len(item.chunks) <= 3
        assert all(c.endswith("\n") and c == format_chunk(c[:-1]) for c in item.chunks)
        assert item.suffix.startswith("Question: ") and item.suffix.endswith("\nAnswer:")
        assert item.kind in KINDS and item.metric == "contains" and item.answers


def test_synthetic_offset_and_limit_window_the_same_sequence() -> None:
    assert load_synthetic(2, offset=1) == load_synthetic(3)[1:]
    assert load_synthetic(0) == []
    with pytest.raises(ValueError):
        load_synthetic(2, offset=-1)


def _write_cacheblend(path: Path) -> list[dict]:
    records = [{"question": f"Who is {i}?", "answers": [f"person {i}", "x"],
                "ctxs": [{"title": f"T{i}{j}",
                          "text": f"text {i} {j}"} for j in range(3)]} for i in range(4)]
    path.write_text(json.dumps(records))
    return records


def test_cacheblend_json_prompt_is_the_authors(tmp_path: Path) -> None:
    path = tmp_path / "tiny_set.json"
    records = _write_cacheblend(path)
    items = load_cacheblend_json(path)
    assert len(items) == 4
    item = items[1]
    assert item.prefix == ("You will be asked a question after reading several passages. Please "
                           "directly answer "
                           "the question based on the given passages. Do NOT repeat the question. "
                           "The answer should be within 5 words.\nPassages:\n") == CACHEBLEND_PREFIX
    assert item.chunks == ("T10\n\ntext 1 0\n\n", "T11\n\ntext 1 1\n\n", "T12\n\ntext 1 2\n\n")
    assert item.suffix == AUTHORS_SUFFIX.format(q="Who is 1?")
    assert item.answers == tuple(records[1]["answers"]) and item.kind == "tiny_set"
    assert load_cacheblend_json(path, limit=2, offset=1) == items[1:3]
    assert load_cacheblend_json(path, offset=10) == []


def test_cacheblend_json_rejects_other_formats(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q", "answers": ["a"]}]))
    with pytest.raises(ValueError, match="CacheBlend"):
        load_cacheblend_json(bad)
    bad.write_text(json.dumps({"question": "q"}))
    with pytest.raises(ValueError):
        load_cacheblend_json(bad)


def test_real_musique_file_format() -> None:
    raw = json.loads(MUSIQUE.read_text())
    items = load_dataset(MUSIQUE, limit=2)
    assert len(items) == 2
    for item, rec in zip(items, raw):
        assert len(item.chunks) == len(rec["ctxs"]) == 10
        assert item.chunks[0] == f"{rec['ctxs'][0]['title']}\n\n{rec['ctxs'][0]['text']}\n\n"
        assert item.suffix == AUTHORS_SUFFIX.format(q=rec["question"])
        assert item.answers == tuple(rec["answers"]) and item.kind == "musique_s"
    assert items[0].answers[0] == "Exeter College"


def test_musique_in_the_paper_shape_keeps_the_answer_passages() -> None:
    raw = json.loads(MUSIQUE.read_text())
    items = load_musique(limit=20)
    assert [i.suffix for i in items] == [AUTHORS_SUFFIX.format(q=r["question"]) for r in raw[:20]]
    for item, rec in zip(items, raw):
        assert len(item.chunks) == 6 and item.kind == "musique" and item.metric == "qa_f1"
        texts = [f"{c['title']}\n\n{c['text']}\n\n" for c in rec["ctxs"]]
        holding = [t for t in texts if any(a.lower() in t.lower() for a in rec["answers"])]
        # every passage holding the answer (up to 6) is in
        assert set(holding[:6]) <= set(item.chunks)
        # retrieval order
        assert [texts.index(c) for c in item.chunks] == sorted(texts.index(c) for c in item.chunks)


def test_fit_tokens_cuts_after_a_word_and_keeps_the_separator() -> None:
    count = lambda text: len(text.split())  # noqa: E731  (a word tokenizer)
    text = "one two three four five six\n\n"
    assert fit_tokens(text, 10, count) == text
    assert fit_tokens(text, 4, count) == "one two three four\n\n"
    with pytest.raises(ValueError, match="max_tokens"):
        fit_tokens(text, 0, count)


def test_split_context_at_passages_within_bound() -> None:
    passages = [f"Passage {i}:\nTitle {i}\n" + "word " * (10 + i) + "\n" for i in range(1, 6)]
    text = "".join(passages)
    assert split_context(text, max_chars=10_000) == [text]
    one_each = split_context(text, max_chars=max(len(p) for p in passages))
    assert one_each == passages
    packed = split_context(text, max_chars=2 * max(len(p) for p in passages))
    assert "".join(packed) == text and len(packed) < len(passages)
    assert all(c.startswith("Passage ") for c in packed)


def test_split_context_paragraphs_and_long_pieces() -> None:
    text = "alpha beta gamma.\n\ndelta epsilon.\n\n" + "zeta " * 40
    chunks = split_context(text, max_chars=40)
    assert "".join(chunks) == text
    assert all(len(c) <= 40 for c in chunks)
    assert chunks[0] == "alpha beta gamma.\n\ndelta epsilon.\n\n"  # two paragraphs packed: 35 chars
    assert chunks[1:] == ["zeta " * 8] * 5  # the long paragraph cut after whitespace
    # hard cut in a word
    assert split_context("x" * 25, max_chars=10) == ["x" * 10, "x" * 10, "x" * 5]
    with pytest.raises(ValueError):
        split_context(text, max_chars=0)


def test_longbench_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "lb.jsonl"
    rows = [{"input": f"q{i}?", "context": f"Passage 1:\nA{i}\n\nPassage 2:\nB{i}\n",
             "answers": [f"a{i}"],
             "dataset": "hotpotqa"} for i in range(3)]
    rows.append({"input": "Summarize.", "context": "para one.\n\npara two.", "answers": ["sum"],
                 "dataset": "gov_report"})
    path.write_text(
        "\n".join(json.dumps(r) for r in rows[:2])
        + "\n\n"
        + "\n".join(json.dumps(r) for r in rows[2:])
    )
    items = load_longbench_jsonl(path)
    assert len(items) == 4
    assert items[0].prefix == LONGBENCH_PREFIX
    assert items[0].chunks == ("Passage 1:\nA0\n\nPassage 2:\nB0\n",)
    assert items[0].suffix.endswith("\n\nQuestion: q0?\nAnswer:")
    assert items[0].kind == "hotpotqa" and items[0].metric == "qa_f1"
    assert items[3].kind == "gov_report" and items[3].metric == "rouge_l"
    assert load_longbench_jsonl(path, limit=2, offset=1) == items[1:3]
    small = load_longbench_jsonl(path, limit=1, max_chars=20)
    assert small[0].chunks == ("Passage 1:\nA0\n\n", "Passage 2:\nB0\n")


def test_load_dataset_dispatch(tmp_path: Path) -> None:
    assert load_dataset("synthetic", limit=1)[0].prefix == PREFIX
    path = tmp_path / "set.json"
    _write_cacheblend(path)
    assert load_dataset(path, limit=1)[0].prefix == CACHEBLEND_PREFIX
    assert dataset_name(path) == "set" and dataset_name("synthetic") == "synthetic"
    other = tmp_path / "set.csv"
    other.write_text("x")
    with pytest.raises(ValueError):
        load_dataset(other)
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.json")


def test_eval_item_validation() -> None:
    ok = dict(prefix="p", chunks=["c"], suffix="s", answers=["a"], kind="k")
    assert EvalItem(**ok).chunks == ("c",)
    for bad in (dict(chunks=[]), dict(chunks=[""]), dict(suffix=""), dict(answers=[1]),
                dict(metric="bleu")):
        with pytest.raises(ValueError):
            EvalItem(**(ok | bad))
    # a prompt without gold answers (a fidelity check compares with full prefill only)
    assert EvalItem(**(ok | dict(answers=[]))).answers == ()
    assert format_suffix("q") == "Question: q\nAnswer:"
