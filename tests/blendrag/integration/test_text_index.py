"""Finding ingested chunk texts inside a flat prompt."""

from __future__ import annotations

import pytest

from blendrag.integration.text_index import ChunkTextIndex

DOCS = [
    "Lionel Messi was born in Rosario, Argentina, in 1987.",
    "Cristiano Ronaldo was born in Funchal, Madeira, in 1985.",
    # same anchor, longer
    "Cristiano Ronaldo was born in Funchal, Madeira, in 1985. He plays for Al Nassr.",
]


def test_split_finds_documents_and_keeps_gaps():
    index = ChunkTextIndex()
    assert index.add_many(DOCS[:2]) == 2
    prompt = "Context:\n" + DOCS[0] + "\n\n" + DOCS[1] + "\n\nQuestion: who is older?"
    split = index.split(prompt)
    assert split.prefix == "Context:\n" and split.suffix == "\n\nQuestion: who is older?"
    assert split.chunks == (DOCS[0], "\n\n", DOCS[1]) and split.cached == (True, False, True)
    assert split.prefix + "".join(split.chunks) + split.suffix == prompt


def test_longest_match_wins_and_unknown_text_is_not_found():
    index = ChunkTextIndex()
    index.add_many(DOCS)
    assert index.split("x " + DOCS[2] + " y").chunks == (DOCS[2],)
    assert index.split("x " + DOCS[1] + " y").chunks == (DOCS[1],)
    assert index.split("nothing indexed here at all, just a question?").found == 0


def test_short_texts_are_refused():
    index = ChunkTextIndex(min_chars=16)
    assert not index.add("too short")
    assert len(index) == 0


def test_persistent_index_is_shared_between_instances(tmp_path):
    a = ChunkTextIndex(tmp_path / "idx")
    a.add(DOCS[0])
    b = ChunkTextIndex(tmp_path / "idx")
    assert DOCS[0] in b
    a.add(DOCS[1])
    b.refresh()
    assert DOCS[1] in b


def test_bad_min_chars():
    with pytest.raises(ValueError, match="min_chars"):
        ChunkTextIndex(min_chars=0)
