"""The ingestion-cache key (what KVs depend on, where they and the texts land) comes from one
recipe, for a running engine and for an EngineSpec, and changes whenever skipping the
ingestion would lose something."""

from __future__ import annotations

import dataclasses

from blendrag import EngineSpec
from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
from blendrag.integration.chunks import ChunkFormat
from blendrag.integration.ingestion_key import (
    KVIdentity,
    engine_persistence,
    spec_persistence,
)
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.store import MemoryKVStore, StoreConfig

FMT = ChunkFormat()


def test_a_spec_key_changes_with_each_thing_the_kvs_depend_on():
    spec = EngineSpec(model="demo", chunk_prefix="", chat=False)
    key = KVIdentity.of_spec(spec).key(FMT)
    assert KVIdentity.of_spec(EngineSpec(model="demo", chunk_prefix="", chat=False)).key(FMT) \
        == key
    changed = [dataclasses.replace(spec, **kw) for kw in (
        {"model": "other"}, {"dtype": "bfloat16"}, {"gguf_file": "m.gguf"}, {"chat": True},
        {"system": "Be brief."}, {"chunk_prefix": "Docs:\n"}, {"context": NO_CONTEXT},
        {"context": ChunkContext(fillers=("x",))})]
    keys = {KVIdentity.of_spec(s).key(FMT) for s in changed}
    assert len(keys) == len(changed) and key not in keys
    assert KVIdentity.of_spec(spec).key(ChunkFormat("[{text}]")) != key
    assert KVIdentity.of_spec(spec).key(ChunkFormat(separator="\n--\n")) != key
    # what does not change the KVs does not change the key
    assert KVIdentity.of_spec(dataclasses.replace(spec, threads=None,
                                                  prefix_cache_bytes=1 << 20)).key(FMT) == key


def test_an_engine_key_changes_with_chunk_prefix_and_context(model_dir):
    spec = EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="",
                      context=NO_CONTEXT)
    engine = spec.build()
    key = KVIdentity.of_engine(engine).key(FMT)
    assert KVIdentity.of_engine(spec.build(engine.store)).key(FMT) == key  # same weights
    for other in (dataclasses.replace(spec, chunk_prefix="Docs:\n"),
                  dataclasses.replace(spec, context=ChunkContext(fillers=("x",)))):
        assert KVIdentity.of_engine(other.build(engine.store)).key(FMT) != key


def test_two_s3_buckets_give_two_keys_on_both_paths(tmp_path):
    base = StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv")
    one = dataclasses.replace(base, s3_url="s3://one/kv", s3_endpoint_url="http://127.0.0.1:1")
    two = dataclasses.replace(one, s3_url="s3://two/kv")
    spec = EngineSpec(model="demo", chunk_prefix="")
    keys = [spec_persistence(dataclasses.replace(spec, store=s), None) for s in (base, one, two)]
    assert len(set(keys)) == 3
    assert all(s.location() in k for s, k in zip((base, one, two), keys))
    # a running engine's store reports the same location (TieredKVStore.location is the
    # config's), so both paths name the S3 tier the same way
    assert "s3=s3://one/kv at http://127.0.0.1:1" in keys[1]


def test_a_location_that_dies_with_the_process_is_unique_to_its_object(model_dir, tmp_path):
    engine = EngineSpec(model=model_dir("llama"), device="cpu", chat=False,
                        chunk_prefix="").build(MemoryKVStore())
    index = ChunkTextIndex()
    assert engine_persistence(engine, index) == engine_persistence(engine, index)
    assert engine_persistence(engine, index) != engine_persistence(engine, ChunkTextIndex())
    kept = ChunkTextIndex(tmp_path / "texts")
    assert str((tmp_path / "texts").resolve()) in engine_persistence(engine, kept)
    ram = EngineSpec(model="demo", chunk_prefix="")
    assert spec_persistence(ram, None) != spec_persistence(ram, None)
    disk = dataclasses.replace(ram, store=StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv"))
    assert spec_persistence(disk, None) == spec_persistence(disk, None)
    assert str((tmp_path / "kv" / "text_index").resolve()) in spec_persistence(disk, None)
