"""A shard of a distributed precompute (Dask, Spark, a Ray actor): picklable settings, the same
entries and summary as the local job, resumable; and the Ray options' checks (no Ray needed)."""

from __future__ import annotations

import argparse
import pickle
import sqlite3
import sys

import pytest

from blendrag import NO_CONTEXT
from blendrag.cli.precompute_ray import check_ray_args, shared_store
from blendrag.distributed import IngestSettings, combine, ingest_shard, shard
from blendrag.distributed.settings import shared_engine
from blendrag.distributed.shard import ingest_rows, summarize, text_of
from blendrag.ingest import ingest_source
from blendrag.store import StoreConfig
from helpers.recorders import RecordingIndex
from helpers.tiny import PASSAGES, PREFIX

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = [p + f"Entry {i}." for i in range(3) for p in PASSAGES] + ["", "lone \ud800 surrogate"]


def _settings(model_dir, folder, **kw) -> IngestSettings:
    return IngestSettings(model=str(model_dir("llama")), device="cpu", chat=False,
                          chunk_prefix=None, prefix=PREFIX, context=NO_CONTEXT,
                          store=StoreConfig(ram_bytes=0, disk_dir=folder), **kw)


def test_shards_store_and_count_what_the_local_job_does(model_dir, tmp_path):
    settings = _settings(model_dir, tmp_path / "a", batch_size=4)
    assert pickle.loads(pickle.dumps(settings)) == settings
    first = ingest_shard(settings, TEXTS[:7])
    rest = ingest_shard(settings, TEXTS[7:], first_index=7)
    whole = combine([first, rest])

    local_settings = _settings(model_dir, tmp_path / "b")
    engine = local_settings.build_engine()
    local = ingest_source(engine, TEXTS, prefix=PREFIX, progress=False)
    fields = ("chunks", "computed", "skipped", "empty", "tokens", "bytes", "refused", "failures")
    assert [getattr(whole, f) for f in fields] == [getattr(local, f) for f in fields]
    assert (whole.computed, whole.failures[0].index, whole.seconds) == (
        12, 13, max(first.seconds, rest.seconds))
    assert whole.to_dict()["failed"] == 1 and not whole.complete

    again = ingest_shard(settings, TEXTS)  # resumed: nothing left to compute
    assert (again.computed, again.skipped, again.tokens) == (0, 12, 0)
    shard_engine, _ = shared_engine(settings)  # the engine the shards ran on
    keys = [shard_engine.key(shard_engine.prompts.chunk_prefix_ids(PREFIX),
                             shard_engine.prompts.encode(t)) for t in TEXTS[:12]]
    assert shard_engine.store.missing(keys) == [] and engine.store.missing(keys) == []


def test_chunks_no_tier_kept_are_not_stored_in_rows_summary_and_text_index(
        model_dir, tmp_path, monkeypatch):
    from blendrag.store.disk import DiskTier

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    engine = _settings(model_dir, tmp_path).build_engine()
    monkeypatch.setattr(DiskTier, "put", full)
    index = RecordingIndex()
    rows = ingest_rows(engine, PASSAGES, prefix=PREFIX, indexes=range(4), text_index=index)
    assert [r["status"] for r in rows] == ["not_stored"] * 4
    assert [r["bytes"] for r in rows] == [0] * 4
    assert all("No space left" in r["reason"] for r in rows)
    assert index.texts == []  # no KV stored: no text recorded
    summary = summarize(rows, 1.0)
    assert (summary.computed, summary.not_stored, summary.tokens, summary.complete) == (
        0, 4, 0, False)
    assert [f.index for f in summary.failures] == [0, 1, 2, 3]


class FullIndex:
    """A text index on a full disk."""

    calls = 0

    def record(self, texts):
        self.calls += 1
        raise sqlite3.OperationalError("database or disk is full")


def test_a_failing_text_index_is_reported_by_the_shard_not_raised(model_dir, tmp_path,
                                                                   monkeypatch):
    settings = _settings(model_dir, tmp_path, batch_size=2)
    engine = settings.build_engine()
    rows = ingest_rows(engine, PASSAGES, prefix=PREFIX, text_index=FullIndex())
    assert [r["status"] for r in rows] == ["computed"] * 4  # the KVs are stored all the same
    summary = summarize(rows, 1.0)
    assert summary.computed == 4 and not summary.complete
    assert summary.text_index_error == ("stopped recording texts: OperationalError: database "
                                        "or disk is full")
    assert combine([summary, summarize([], 0.0)]).text_index_error == summary.text_index_error

    index = FullIndex()  # a shard of two batches: stops recording after the first failure
    monkeypatch.setattr(shard, "shared_engine", lambda s: (settings.build_engine(), index))
    whole = ingest_shard(settings, [p + " Again." for p in PASSAGES])
    assert (whole.computed, index.calls) == (4, 1)
    assert "database or disk is full" in whole.text_index_error


def test_documents_and_nodes_give_their_text():
    Document = pytest.importorskip("langchain_core.documents").Document
    TextNode = pytest.importorskip("llama_index.core.schema").TextNode

    node = TextNode(text="body", metadata={"title": "T"}, excluded_llm_metadata_keys=[])
    assert text_of(Document(page_content="a page")) == "a page"
    assert text_of(node) == "title: T\n\nbody"
    with pytest.raises(ValueError, match="a str, a LangChain Document or a LlamaIndex node"):
        text_of(3)


@pytest.mark.parametrize("kw, message", [
    ({"model": None}, "model must be a model name or path"),
    ({"dtype": "int4"}, "dtype must be one of"),
    ({"threads": 0}, "threads must be a count"),
    ({"prefix": "Q: "}, "chunk_prefix or prefix, not both"),
    ({"chunk_prefix": None}, "needs chunk_prefix"),
    ({"store": StoreConfig(disk_dir=None)}, "must outlive the workers"),
    ({"context": "fill"}, "context must be a ChunkContext"),
    ({"batch_size": 0}, "batch_size must be >= 1"),
])
def test_settings_refuse_what_a_worker_cannot_use(kw, message, tmp_path):
    kw.setdefault("store", StoreConfig(ram_bytes=0, disk_dir=tmp_path))
    with pytest.raises(ValueError, match=message):
        IngestSettings(**kw)


def _args(**kw) -> argparse.Namespace:
    base = {"ray": "local", "actors": 1, "gpus_per_actor": 0.0, "profile_neighbours": 0}
    return argparse.Namespace(**{**base, **kw})


def test_ray_options_are_checked_before_anything_starts():
    check_ray_args(_args())
    with pytest.raises(ValueError, match="apply to --ray jobs only"):
        check_ray_args(_args(ray=None, actors=2))
    with pytest.raises(ValueError, match="--actors must be >= 1"):
        check_ray_args(_args(actors=0))
    with pytest.raises(ValueError, match="--gpus-per-actor must be >= 0"):
        check_ray_args(_args(gpus_per_actor=-1))
    with pytest.raises(ValueError, match="measure profiles in a local job"):
        check_ray_args(_args(profile_neighbours=1))


def test_several_nodes_need_a_shared_tier(tmp_path, capsys):
    folder = StoreConfig(disk_dir=tmp_path)
    assert shared_store(folder, 1) is folder
    with pytest.raises(ValueError, match="2 nodes: each would write its own --store-dir.*"
                                         "--redis-url or --s3-url"):
        shared_store(folder, 2)
    both = StoreConfig(disk_dir=tmp_path, redis_url="redis://10.0.0.5:6379/0")
    shared = shared_store(both, 2)
    assert (shared.disk_dir, shared.ram_bytes, shared.redis_url) == (None, 0, both.redis_url)
    assert "write into the redis tier only" in capsys.readouterr().err
    s3 = shared_store(StoreConfig(disk_dir=tmp_path, s3_url="s3://bucket/kv"), 3)
    assert (s3.disk_dir, s3.s3_url) == (None, "s3://bucket/kv")
    assert "write into the s3 tier only" in capsys.readouterr().err
    assert IngestSettings(store=StoreConfig(ram_bytes=0, disk_dir=None,
                                            s3_url="s3://bucket/kv")).store.s3_url


def test_without_ray_the_error_names_the_extra(monkeypatch):
    from blendrag.distributed.ray import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install blendrag\[ray\]"):
        require_ray()


def test_a_ray_job_for_the_frameworks_records_texts_where_their_llms_look(tmp_path):
    """--chunk-prefix without --text-index: the store's own text index (per namespace), as the
    local job records them; none where the store has no folder (several nodes)."""
    import argparse

    from blendrag.cli.precompute_ray import _text_index
    from blendrag.store import StoreConfig

    def args(**kw):
        return argparse.Namespace(**{"text_index": None, "chunk_prefix": "", **kw})

    store = StoreConfig(disk_dir=tmp_path / "kv")
    assert _text_index(args(), store) == tmp_path / "kv" / "text_index"
    acme = StoreConfig(disk_dir=tmp_path / "kv", namespace="acme")
    assert _text_index(args(), acme) == tmp_path / "kv" / f"text_index.{acme.names.ns_id}"
    assert _text_index(args(text_index=tmp_path / "mine"), store) == tmp_path / "mine"
    assert _text_index(args(chunk_prefix=None), store) is None  # the engine's own prompts
    assert _text_index(args(), StoreConfig(disk_dir=None)) is None
