"""Stored K/V formats (``StoreConfig.kv_format``): each round-trips within its stated error and
size, layer-wise reads equal whole reads, a header that lies about its format is refused,
entries of the previous version still read, and an engine on a compressed store gives
pipelined logits equal to sequential ones."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import safetensors.torch
import torch

from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.codec import KV_FORMATS, decode, encode, meta_digest, open_entry
from blendrag.store.errors import EntryError
from helpers.kvgen import make_kv, same_bits
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

KEY = "formats"
SHAPE = dict(layers=2, heads=2, tokens=256, dim=64)
# format: (largest relative L2 error of K and V, largest bytes as a share of float32's)
BOUNDS = {"bfloat16": (4e-3, 0.505), "float16": (5e-4, 0.505), "int8": (1.5e-2, 0.27)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("kv_format", sorted(BOUNDS))
def test_each_format_round_trips_within_its_error_and_size(kv_format):
    kv = make_kv(1, **SHAPE)
    exact = encode(KEY, kv)
    data = encode(KEY, kv, kv_format)
    out = decode(data, KEY)
    error, share = BOUNDS[kv_format]
    assert out.keys.dtype == out.values.dtype == torch.float32  # decoded to the model's dtype
    assert _rel(out.keys, kv.keys) <= error and _rel(out.values, kv.values) <= error
    assert 0 < _rel(out.keys, kv.keys)  # really compressed
    assert len(data) <= share * len(exact)
    assert out.token_ids == kv.token_ids and out.prefix_hash == kv.prefix_hash


def test_the_model_format_is_exact():
    kv = make_kv(2, **SHAPE)
    for data in (encode(KEY, kv), encode(KEY, kv, "model")):
        assert same_bits(decode(data, KEY), kv)
    assert "model" in KV_FORMATS


def test_a_default_store_keeps_bfloat16_and_reads_back_the_model_dtype(tmp_path):
    # the default stored format (chosen by the quality benchmark's KL, docs/store.md)
    assert StoreConfig(disk_dir=None).kv_format == "bfloat16"
    kv = make_kv(2, **SHAPE)
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv")) as store:
        store.put(KEY, kv)
        got = store.get(KEY)
        entry = store.open_layers(KEY)
        try:
            k0, _ = entry.layer(0)
        finally:
            entry.close()
    entry_file = next(p for p in (tmp_path / "kv").rglob("*.val"))
    assert got.keys.dtype == kv.keys.dtype == torch.float32
    assert torch.equal(got.keys, kv.keys.to(torch.bfloat16).float())  # a bf16 cast, exactly
    assert torch.equal(got.values, kv.values.to(torch.bfloat16).float())
    assert torch.equal(k0, got.keys[0])
    assert entry_file.stat().st_size < 0.55 * encode(KEY, kv).__len__()


@pytest.mark.parametrize("kv_format", sorted(BOUNDS))
def test_a_layer_read_alone_equals_the_whole_read(kv_format):
    kv = make_kv(3, profile=True, **SHAPE)
    data = encode(KEY, kv, kv_format)
    whole = decode(data, KEY)
    with open_entry(data, KEY) as entry:
        for i in range(kv.num_layers):
            k, v = entry.layer(i)
            assert torch.equal(k, whole.keys[i]) and torch.equal(v, whole.values[i])
        assert torch.equal(entry.read_priors()[0], kv.profile)


def _rewrite(data: bytes, tensors=None, **fields) -> bytes:
    tensors = safetensors.torch.load(data) if tensors is None else tensors
    header_len = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8: 8 + header_len])["__metadata__"]
    meta.update(fields)
    meta = {k: v for k, v in meta.items() if v is not None and k != "meta_checksum"}
    meta["meta_checksum"] = meta_digest(meta)
    return safetensors.torch.save(tensors, metadata=meta)


@pytest.mark.parametrize("claims,written", [("bfloat16", "model"), ("int8", "float16"),
                                            ("model", "int8"), ("float16", "bfloat16")])
def test_a_header_that_lies_about_its_format_is_refused(claims, written):
    kv = make_kv(4, **SHAPE)
    data = encode(KEY, kv, written)
    with pytest.raises(EntryError):
        decode(_rewrite(data, stored="float32" if claims == "model" else claims), KEY)


def test_an_int8_entry_without_its_scales_is_refused():
    data = encode(KEY, make_kv(5, **SHAPE), "int8")
    tensors = safetensors.torch.load(data)
    del tensors["ks.1"]
    with pytest.raises(EntryError):
        decode(_rewrite(data, tensors), KEY)


def test_entries_of_version_3_still_read():
    kv = make_kv(6, **SHAPE)
    old = _rewrite(encode(KEY, kv), version="3", stored=None)
    assert same_bits(decode(old, KEY), kv)


def test_an_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="kv_format must be one of model, bfloat16"):
        StoreConfig(disk_dir=None, kv_format="fp8")
    with pytest.raises(ValueError, match="kv_format must be one of"):
        encode(KEY, make_kv(7), "int4")


@pytest.mark.parametrize("kv_format", sorted(BOUNDS))
def test_a_store_keeps_the_format_on_disk_and_reads_any(tmp_path, kv_format):
    kv = make_kv(8, **SHAPE)
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path, kv_format=kv_format)) as s:
        s.put("k", kv)
        got = s.get("k")
    assert _rel(got.keys, kv.keys) <= BOUNDS[kv_format][0]
    # another process with another format setting reads it as stored
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path)) as other:
        assert torch.equal(other.get("k").keys, got.keys)


def test_pipelined_equals_sequential_on_a_compressed_store(engine_for, make_store):
    from blendrag import BlendConfig

    engine = engine_for("llama", layers=4)
    engine.store = make_store(ram_bytes=0, kv_format="int8")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=True)
    for config in (BlendConfig(mode="reuse"), BlendConfig(ratio=0.3),
                   BlendConfig(selector="cacheblend", ratio=0.3)):
        engine.loading = replace(engine.loading, prefetch_layers=0)
        sequential = engine.prefill(layout, config)
        engine.loading = replace(engine.loading, prefetch_layers=2)
        pipelined = engine.prefill(layout, config)
        assert torch.equal(pipelined.logits, sequential.logits), config.label
        assert sequential.stats.cache.chunk_hits == len(layout.chunk_ids)


def test_layer_reads_count_the_bytes_stored_not_the_rows_returned(tmp_path):
    kv = make_kv(4, **SHAPE)  # float32 rows
    layers, heads, tokens, dim = kv.keys.shape
    for kv_format, itemsize in (("model", 4), ("bfloat16", 2)):
        with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / kv_format,
                                       kv_format=kv_format)) as store:
            store.put(KEY, kv)
            entry = store.open_layers(KEY)
            try:
                for i in range(layers):
                    entry.layer(i)
            finally:
                entry.close()
            read = store.stats().tier("disk").bytes_read
            assert read == layers * 2 * heads * tokens * dim * itemsize, kv_format


def test_an_exact_entry_read_layer_by_layer_is_promoted_exactly(tmp_path, redis_server,
                                                                redis_prefix):
    """A prefix (stored exactly) found in Redis and copied into the disk tier stays exact there,
    though the disk tier stores bfloat16; a chunk stored as bfloat16 is copied as it is."""
    redis = {"redis_url": redis_server.url, "redis_prefix": redis_prefix}
    exact, rounded = make_kv(5, **SHAPE), make_kv(6, **SHAPE)
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=None, **redis)) as shared:
        shared.put("prefix", exact, exact=True)
        shared.put("chunk", rounded)
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", **redis)) as store:
        for key in ("prefix", "chunk"):
            entry = store.open_layers(key)
            try:
                entry.materialize()
            finally:
                entry.close()  # read through: copied into the disk tier
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv")) as disk:
        assert same_bits(disk.get("prefix"), exact)
        got = disk.get("chunk")
        assert torch.equal(got.keys, rounded.keys.to(torch.bfloat16).float())
