"""Nothing at all to ingest is said, never passed over: ``engine.ingest`` of no text or of texts
without a token raises ValueError naming it (the check lives in the one ingestion path), the
bulk job's summary says it, and ``blendrag precompute`` over an empty file exits with 2."""

from __future__ import annotations

import pytest

from blendrag import NO_CONTEXT, BlendEngine
from blendrag.cli import main
from blendrag.ingest import IngestCounts, Ingestion, ingest_source
from helpers.tiny import PASSAGES, PREFIX

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def engine(model_dir, make_store) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       store=make_store(), context=NO_CONTEXT)


def test_engine_ingest_of_nothing_raises_saying_so(engine):
    with pytest.raises(ValueError, match="^no chunk text was given: nothing to ingest$"):
        engine.ingest([], prefix=PREFIX)
    with pytest.raises(ValueError, match=r"^none of the 2 chunk texts has a token \(empty "
                                         r"text\): nothing to ingest$"):
        engine.ingest(["", ""], prefix=PREFIX)
    assert engine.ingest(["", PASSAGES[0]], prefix=PREFIX) == [None, True]  # one to store: fine


def test_a_later_batch_of_nothing_does_not_raise_once_something_was_ingested(engine):
    run = Ingestion(engine, PREFIX)
    assert run.ingest([PASSAGES[1]]) == [True]
    assert run.ingest([""]) == [None]  # the run as a whole had something to store
    assert run.counts.nothing is None


def test_counts_and_the_bulk_job_say_nothing_was_ingested(engine):
    assert IngestCounts().nothing == "no chunk text was given: nothing to ingest"
    assert IngestCounts(chunks=1, empty=1).nothing.startswith("none of the 1 chunk text has")
    summary = ingest_source(engine, ["", ""], prefix=PREFIX, progress=False)  # no raise
    assert (summary.chunks, summary.empty, summary.computed) == (2, 2, 0)
    assert summary.nothing.startswith("none of the 2 chunk texts has a token")
    assert ingest_source(engine, [PASSAGES[0]], prefix=PREFIX, progress=False).nothing is None


def test_precompute_over_an_empty_file_exits_2_saying_why(model_dir, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "empty.md").write_text("")
    argv = ["precompute", "--model", str(model_dir("llama")), "--device", "cpu", "--store-dir",
            str(tmp_path / "kv"), "--no-chat", "--prefix", PREFIX, "--no-progress", "--folder",
            str(docs), "--glob", "*.md"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "chunks 1: computed 0, already stored 0, empty 1" in out  # the summary, then why
    assert err.strip() == (f"blendrag precompute: error: folder {docs} (*.md): none of the 1 "
                           "chunk text has a token (empty text): nothing to ingest")
    (docs / "a.md").write_text(PASSAGES[0])
    assert main(argv) == 0  # one file with text: something was ingested
