"""The ingestion job tells the truth: what was not persisted is not counted as
computed and is named with the reason, chunks longer than the context and texts that are not
valid Unicode are refused while the others go on, a failing text index is reported, and bad
inputs raise a clear ValueError."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine, MemoryKVStore
from blendrag.ingest import Ingestion, chunks_from_folder, chunks_from_jsonl, ingest_source
from blendrag.store import disk_files
from helpers.recorders import RecordingIndex
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")

LONG = "the quick brown fox jumps over the lazy dog " * 150  # > 1024 tokens of the tiny model


@pytest.fixture
def engine(model_dir, make_store) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       store=make_store(retry_after_s=3600), context=NO_CONTEXT)


def _full_disk_after(monkeypatch, writes: int) -> None:
    """Make the disk full once ``writes`` more entry files have been written."""
    real = disk_files._write_new
    left = [writes]

    def write(folder, name, iterator):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        left[0] -= 1
        return real(folder, name, iterator)

    monkeypatch.setattr(disk_files, "_write_new", write)


def test_full_disk_counts_only_what_was_persisted_and_names_the_rest(engine, monkeypatch,
                                                                     make_store):
    _full_disk_after(monkeypatch, 3)  # the prefix and two chunks fit
    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert (summary.chunks, summary.computed, summary.not_stored) == (4, 2, 2)
    assert not summary.complete and [f.index for f in summary.failures] == [2, 3]
    assert all("No space left" in f.reason for f in summary.failures)
    assert "NOT STORED: 2 chunks" in summary.format() and "No space left" in summary.format()
    on_disk = make_store(ram_bytes=0)  # what another process finds there
    assert on_disk.stats().tier("disk").entries == 3  # prefix + the two counted
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    keys = [engine.key(prefix_ids, engine.prompts.encode(t)) for t in PASSAGES]
    assert on_disk.missing(keys) == keys[2:]  # exactly the two listed


def test_a_chunk_not_stored_has_no_kv_and_its_text_is_not_recorded(engine, monkeypatch):
    _full_disk_after(monkeypatch, 3)  # the prefix and two chunks fit
    run = Ingestion(engine, PREFIX, strict=False)
    assert run.ingest(PASSAGES) == [True, True, None, None]  # not True: no stored KV
    assert (run.counts.computed, run.counts.not_stored) == (2, 2)


def test_the_job_records_only_the_texts_whose_kv_was_stored(engine, monkeypatch):
    _full_disk_after(monkeypatch, 3)
    index = RecordingIndex()
    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False, text_index=index)
    assert (summary.computed, summary.not_stored) == (2, 2)
    assert index.texts == PASSAGES[:2]


def test_store_dir_that_is_a_file_is_refused_before_anything_is_computed(model_dir, tmp_path,
                                                                        make_store):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=make_store(disk_dir=blocker), context=NO_CONTEXT)
    for ingest in (lambda: ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False),
                   lambda: engine.ingest(PASSAGES, PREFIX)):
        with pytest.raises(ValueError, match=f"cannot keep what ingestion computes: .*{blocker}"):
            ingest()
    assert blocker.read_text() == "not a directory"  # nothing valid is lost


def test_a_store_that_fails_only_after_opening_still_lists_what_was_not_stored(
        model_dir, tmp_path, make_store, monkeypatch):
    """The check before computing cannot see a disk that fills up later: that case is still
    counted and listed chunk by chunk."""
    from blendrag.store.disk import DiskTier

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    store = make_store(ram_bytes=0)
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=store, context=NO_CONTEXT)
    monkeypatch.setattr(DiskTier, "put", full)
    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert (summary.computed, summary.not_stored) == (0, 4)
    assert all("No space left" in f.reason for f in summary.failures)


def test_a_ram_only_store_counts_what_it_holds(model_dir):
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=MemoryKVStore(), context=NO_CONTEXT)
    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert summary.complete and summary.computed == 4


def test_chunks_longer_than_the_context_are_refused_and_the_others_stored(engine):
    texts = [PASSAGES[0], LONG, PASSAGES[1]]
    n = len(engine.prompts.encode(LONG))
    assert n > engine.adapter.max_positions
    summary = ingest_source(engine, texts, prefix=PREFIX, progress=False)
    assert (summary.computed, summary.refused) == (2, 1) and not summary.complete
    [failure] = summary.failures
    assert failure.index == 1 and f"{n} tokens" in failure.reason
    assert failure.preview.startswith("the quick brown fox")
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    assert not engine.store.contains(engine.key(prefix_ids, engine.prompts.encode(LONG)))
    # the direct API refuses with a clear error before computing anything
    with pytest.raises(ValueError, match="longer than"):
        engine.ingest([PASSAGES[2], LONG], prefix=PREFIX)
    assert not engine.store.contains(engine.key(prefix_ids, engine.prompts.encode(PASSAGES[2])))


def test_a_lone_surrogate_is_refused_with_a_clear_error(engine, tmp_path):
    bad = "half a pair: \ud800 here"
    summary = ingest_source(engine, [PASSAGES[0], bad], prefix=PREFIX, progress=False)
    assert summary.computed == 1 and summary.refused == 1
    assert "not valid Unicode" in summary.failures[0].reason
    with pytest.raises(ValueError, match="not valid Unicode"):
        engine.ingest([bad], prefix=PREFIX)
    with pytest.raises(ValueError, match="not valid Unicode"):
        engine.build_prompt(PREFIX, [bad], SUFFIX)
    # a JSON line can spell one as an escape
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "\\ud800 lone"}\n{"text": "fine text"}\n')
    summary = ingest_source(engine, chunks_from_jsonl(f), prefix=PREFIX, progress=False)
    assert (summary.computed, summary.refused) == (1, 1)


def test_a_failing_text_index_is_reported_not_a_traceback(engine):
    class FullIndex:
        def record(self, texts):
            raise sqlite3.OperationalError("database or disk is full")

    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False,
                            text_index=FullIndex())
    assert summary.computed == 4 and not summary.complete
    assert "database or disk is full" in summary.text_index_error
    assert "text index: stopped recording" in summary.format()


def test_bad_inputs_raise_clear_value_errors(engine):
    with pytest.raises(ValueError, match="single str"):
        ingest_source(engine, "a string", prefix=PREFIX, progress=False)
    with pytest.raises(ValueError, match="single str"):
        engine.ingest("a string", prefix=PREFIX)
    with pytest.raises(ValueError, match="text 0 is a NoneType"):
        engine.ingest([None], prefix=PREFIX)
    with pytest.raises(ValueError, match="PromptLayout"):
        engine.generate("a prompt string")
    with pytest.raises(ValueError, match="ratio"):
        BlendConfig(ratio=True)
    assert engine.store.stats().tier("disk").entries == 0  # nothing was computed


def test_jsonl_bad_lines_are_named_or_skipped(tmp_path):
    f = tmp_path / "c.jsonl"
    lines = ['{"text": "one"}', "not json", "[1, 2]", '{"other": "x"}', '{"text": 5}',
             '{"text": "two"}']
    f.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not JSON"):
        chunks_from_jsonl(f)
    source = chunks_from_jsonl(f, skip_bad_lines=True)
    assert list(source) == ["one", "two"] and len(source) == 2
    reasons = [b.split(": ", 1)[1] for b in source.bad_lines]
    assert [b.split(":")[1] for b in source.bad_lines] == ["2", "3", "4", "5", "7"]
    assert reasons[1:4] == ["expected a JSON object, got list", "no field 'text'",
                            "field 'text' is not a string (int)"]
    assert reasons[4].startswith("not UTF-8")


def test_a_non_utf8_file_in_a_folder_is_named(tmp_path):
    (tmp_path / "a.txt").write_text("fine")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe latin junk")
    with pytest.raises(ValueError, match=f"{os.sep}b.txt: not utf-8 text"):
        list(chunks_from_folder(tmp_path))


def test_direct_ingestion_of_a_str_batch_is_refused(engine):
    run = Ingestion(engine, PREFIX)
    with pytest.raises(ValueError, match="single str"):
        run.ingest("abc")
    assert run.counts.chunks == 0


def test_unreadable_files_in_a_folder_are_skipped_when_asked(tmp_path):
    (tmp_path / "a.txt").write_text("fine")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe latin junk")
    (tmp_path / "c.txt").write_text("also fine")
    source = chunks_from_folder(tmp_path, skip_bad_files=True)
    assert (len(source), list(source)) == (2, ["fine", "also fine"])
    assert len(source.bad_lines) == 1 and "b.txt: not utf-8 text" in source.bad_lines[0]
