"""Finding ingested chunk texts inside a flat prompt."""

from __future__ import annotations

import logging
import os
import pickle
import random
import sqlite3
from pathlib import Path

import pytest

from blendrag.integration.text_index import ChunkTextIndex, find_texts

DOCS = [
    "Lionel Messi was born in Rosario, Argentina, in 1987.",
    "Cristiano Ronaldo was born in Funchal, Madeira, in 1985.",
    # same anchor, longer
    "Cristiano Ronaldo was born in Funchal, Madeira, in 1985. He plays for Al Nassr.",
]


def test_split_finds_documents_and_keeps_gaps():
    index = ChunkTextIndex()
    assert index.record(DOCS[:2]) == 2
    prompt = "Context:\n" + DOCS[0] + "\n\n" + DOCS[1] + "\n\nQuestion: who is older?"
    split = index.split(prompt)
    assert split.prefix == "Context:\n" and split.suffix == "\n\nQuestion: who is older?"
    assert split.chunks == (DOCS[0], "\n\n", DOCS[1]) and split.cached == (True, False, True)
    assert split.prefix + "".join(split.chunks) + split.suffix == prompt


def test_longest_match_wins_and_unknown_text_is_not_found():
    index = ChunkTextIndex()
    index.record(DOCS)
    assert index.split("x " + DOCS[2] + " y").chunks == (DOCS[2],)
    assert index.split("x " + DOCS[1] + " y").chunks == (DOCS[1],)
    assert index.split("nothing indexed here at all, just a question?").found == 0


def test_short_texts_are_refused():
    index = ChunkTextIndex(min_chars=16)
    assert not index.record(["too short"])
    assert len(index) == 0


def test_persistent_index_is_shared_between_instances(tmp_path):
    a = ChunkTextIndex(tmp_path / "idx")
    a.record([DOCS[0]])
    b = ChunkTextIndex(tmp_path / "idx")
    assert DOCS[0] in b
    a.record([DOCS[1]])
    b.refresh()
    assert DOCS[1] in b


def test_bad_min_chars():
    with pytest.raises(ValueError, match="min_chars"):
        ChunkTextIndex(min_chars=0)


def test_overlapping_repeated_and_prefix_sharing_texts():
    a = "The river Danube flows through ten countries of Europe."
    b = a[:30] + " and is nothing like the other passage at all."  # shares a's first 30 chars
    c = a[20:] + " It ends in the Black Sea."  # overlaps a's tail
    index = ChunkTextIndex()
    index.record([a, b, c])
    prompt = f"Q: {a}\n{b}\n{a}{c[len(a) - 20:]}\n{c}?"
    spans = index.find(prompt)
    assert [prompt[s:e] for s, e in spans] == [a, b, a, c]
    assert spans == find_texts(prompt, [a, b, c])
    # c starts inside the second a (overlap): the leftmost text wins, c is not cut out of it
    assert prompt.count(c) == 2 and len(spans) == 4


def test_index_and_given_texts_agree_on_random_prompts():
    """The hashed index and the literal search of a request's own texts follow one rule."""
    rng = random.Random(7)
    for _ in range(40):
        alphabet = "ab "
        texts = ["".join(rng.choices(alphabet, k=rng.randint(4, 80))) for _ in range(12)]
        texts += [texts[0] + texts[1], texts[2][:5] + texts[3]]
        index = ChunkTextIndex(min_chars=4)
        index.record(texts)
        pieces = [rng.choice(texts) if rng.random() < 0.6 else
                  "".join(rng.choices(alphabet, k=rng.randint(0, 9))) for _ in range(10)]
        prompt = "".join(pieces)
        known = [t for t in set(texts) if len(t) >= 4]
        assert index.find(prompt) == find_texts(prompt, known)


def test_unicode_and_lone_surrogates():
    text = "Zürich 🏔 — naïve café, text with characters of every width in it"
    index = ChunkTextIndex()
    index.record([text])
    prompt = "« " + text + " »"
    assert text in index and [prompt[s:e] for s, e in index.find(prompt)] == [text]
    lone = "Zürich \ud800 text with a lone surrogate in it, which no tokenizer reads"
    assert index.record([lone]) == 0 and lone not in index  # left out, in memory too


def test_many_texts_keep_working_as_the_bitmap_grows():
    index = ChunkTextIndex()
    texts = [f"passage number {i} of the corpus, with some words" for i in range(30_000)]
    assert index.record(texts) == 30_000 and len(index) == 30_000
    prompt = "x" + texts[17] + "\n\n" + texts[29_999] + "y"
    assert index.split(prompt).chunks == (texts[17], "\n\n", texts[29_999])
    assert "passage number 30000 of the corpus, with some words" not in index


def test_persisted_texts_are_plain_rows(tmp_path):
    ChunkTextIndex(tmp_path / "idx").record(DOCS)
    with sqlite3.connect(tmp_path / "idx" / "texts.sqlite3") as db:
        rows = db.execute("SELECT typeof(text), text FROM texts ORDER BY id").fetchall()
    assert rows == [("text", t) for t in DOCS]
    reopened = ChunkTextIndex(tmp_path / "idx")
    assert len(reopened) == 3 and all(t in reopened for t in DOCS)


class _Boom:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["BOOM_FILE"]),))


def test_a_planted_pickle_row_is_dropped_not_run(tmp_path, monkeypatch, caplog):
    boom = tmp_path / "boom"
    monkeypatch.setenv("BOOM_FILE", str(boom))
    folder = tmp_path / "idx"
    ChunkTextIndex(folder).record([DOCS[0]])
    with sqlite3.connect(folder / "texts.sqlite3") as db:
        db.execute("INSERT INTO texts (digest, text) VALUES ('x', ?)", (pickle.dumps(_Boom()),))
    with caplog.at_level(logging.WARNING):
        index = ChunkTextIndex(folder)
    assert not boom.exists() and len(index) == 1 and DOCS[0] in index
    assert "not plain text" in caplog.text
    with sqlite3.connect(folder / "texts.sqlite3") as db:  # and deleted: warned about once
        assert db.execute("SELECT COUNT(*) FROM texts").fetchone() == (1,)


def test_old_diskcache_folder_is_read_without_unpickling(tmp_path, monkeypatch, caplog):
    diskcache = pytest.importorskip("diskcache")
    boom = tmp_path / "boom"
    monkeypatch.setenv("BOOM_FILE", str(boom))
    folder = tmp_path / "old"
    with diskcache.Cache(str(folder)) as old:  # what earlier versions wrote
        old.set("a", DOCS[0])
        old.set("b", DOCS[1])
        old.set("evil", _Boom())  # a pickled row (diskcache's pickle mode)
    with caplog.at_level(logging.WARNING):
        index = ChunkTextIndex(folder)
    assert not boom.exists() and len(index) == 2 and DOCS[1] in index
    assert "never unpickled" in caplog.text
    assert len(ChunkTextIndex(folder)) == 2  # migrated once, still there


def test_a_failed_write_records_nothing_so_the_same_call_records_them(tmp_path, monkeypatch):
    """The texts go to the file first, then to memory: a write refused (a store locked by
    another process, a full disk) leaves them unrecorded everywhere, and the next call
    records them, for this process and for a new one."""
    index = ChunkTextIndex(tmp_path / "idx")

    def locked(texts):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(index._rows, "insert", locked)
    with pytest.raises(sqlite3.OperationalError):
        index.record(DOCS[:2])
    assert DOCS[0] not in index and len(index) == 0
    monkeypatch.undo()
    assert index.record(DOCS[:2]) == 2 and DOCS[0] in index
    assert DOCS[0] in ChunkTextIndex(tmp_path / "idx")  # a new process finds them too


def test_a_text_that_is_not_valid_unicode_is_left_out_and_the_rest_recorded(tmp_path, caplog):
    index = ChunkTextIndex(tmp_path / "idx")
    bad = "A lone surrogate \ud800 in a text long enough to record."
    with caplog.at_level(logging.WARNING):
        assert index.record([bad, DOCS[0]]) == 1
    assert "not valid Unicode" in caplog.text
    assert DOCS[0] in index and DOCS[0] in ChunkTextIndex(tmp_path / "idx")


def test_an_index_file_that_is_not_one_is_refused_by_name(tmp_path):
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "texts.sqlite3").write_bytes(b"hostile bytes, not a database" * 200)
    with pytest.raises(ValueError, match="texts.sqlite3 cannot be used .*move it away"):
        ChunkTextIndex(folder)
