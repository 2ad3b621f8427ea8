"""Chunk sources of the precompute job: Chroma (real PersistentClient), a folder, a JSONL file."""

from __future__ import annotations

import json

import pytest

from blendrag.ingest import chunks_from_chroma, chunks_from_folder, chunks_from_jsonl
from helpers.sources import DOCS, make_chroma


def test_chroma_reads_every_document_in_pages(tmp_path):
    make_chroma(tmp_path / "chroma", DOCS)
    source = chunks_from_chroma(tmp_path / "chroma", "docs", page_size=2)
    assert len(source) == 5
    assert list(source) == DOCS
    assert list(source) == DOCS  # iterable again


def test_chroma_missing_collection_or_directory(tmp_path):
    make_chroma(tmp_path / "chroma", DOCS[:1])
    with pytest.raises(ValueError, match=r"no collection 'nope'.*\['docs'\]"):
        chunks_from_chroma(tmp_path / "chroma", "nope")
    with pytest.raises(FileNotFoundError):
        chunks_from_chroma(tmp_path / "absent", "docs")
    assert not (tmp_path / "absent").exists()


def test_folder_one_chunk_per_matching_file_sorted(tmp_path):
    (tmp_path / "b.txt").write_text("second text")
    (tmp_path / "a.txt").write_text("first text")
    (tmp_path / "skip.md").write_text("not matched")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("nested text")
    assert list(chunks_from_folder(tmp_path)) == ["first text", "second text"]
    deep = chunks_from_folder(tmp_path, glob="**/*.txt")
    assert (len(deep), list(deep)) == (3, ["first text", "second text", "nested text"])
    with pytest.raises(FileNotFoundError):
        chunks_from_folder(tmp_path / "absent")


def test_jsonl_field_blank_lines_and_bad_lines(tmp_path):
    f = tmp_path / "chunks.jsonl"
    f.write_text(
        json.dumps({"text": "one", "id": 1})
        + "\n\n"
        + json.dumps({"body": "two", "text": "x"})
        + "\n"
    )
    assert (len(chunks_from_jsonl(f)), list(chunks_from_jsonl(f))) == (2, ["one", "x"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": 3}) + "\n")
    with pytest.raises(ValueError,
                       match=r"bad.jsonl:2: field 'text' is not a string \(int\)"):
        list(chunks_from_jsonl(bad))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not JSON"):
        list(chunks_from_jsonl(bad))


def test_a_glob_matching_nothing_is_an_error_saying_what_is_there(tmp_path):
    (tmp_path / "a.md").write_text("a passage")
    (tmp_path / "b.rst").write_text("another")
    with pytest.raises(FileNotFoundError, match=r"no file under .* matches '\*\.txt' \(files "
                                                r"there end in: \.md, \.rst"):
        chunks_from_folder(tmp_path)
    assert list(chunks_from_folder(tmp_path, glob="*.md")) == ["a passage"]
