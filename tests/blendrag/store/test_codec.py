"""Entry format: bitwise round trip, per-layer reads, and every defect is an EntryError."""

from __future__ import annotations

import json
import os

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import SIGNED_VERSION, decode, encode, meta_digest, open_entry
from blendrag.store.errors import EntryError
from helpers.kvgen import make_kv, rewrite_header, same_bits

KEY = "a" * 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bitwise_exact(dtype, tmp_path):
    kv = make_kv(1, dtype=dtype)
    # Special values must survive as bits, not just compare equal.
    kv.keys[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf")]).to(dtype)
    data = encode(KEY, kv)
    assert same_bits(decode(data, KEY), kv)
    path = tmp_path / "entry.safetensors"
    path.write_bytes(data)
    assert same_bits(decode(path, KEY), kv)
    with open(path, "rb") as handle:
        assert same_bits(decode(handle, KEY), kv)


def test_layout_is_plain_safetensors_one_tensor_per_layer():
    kv = make_kv(2, layers=4, heads=2, tokens=5, dim=8)
    tensors = safetensors.torch.load(encode(KEY, kv))
    assert sorted(tensors) == sorted(f"{k}.{i}" for i in range(4) for k in "kv")
    assert tensors["k.3"].shape == (2, 5, 8)
    assert torch.equal(tensors["v.2"], kv.values[2])


def test_one_layer_reads_without_the_others(tmp_path):
    kv = make_kv(3, layers=3)
    data = bytearray(encode(KEY, kv))
    # Flip a byte inside layer 2's values only; layers 0 and 1 must still read and verify.
    header_len = int.from_bytes(data[:8], "little")
    offsets = json.loads(data[8 : 8 + header_len])["v.2"]["data_offsets"]
    data[8 + header_len + offsets[0]] ^= 0xFF
    path = tmp_path / "entry.safetensors"
    path.write_bytes(bytes(data))
    with open_entry(path, KEY) as entry:
        assert entry.num_layers == 3 and entry.token_ids == kv.token_ids
        k0, v0 = entry.layer(0)
        assert torch.equal(k0, kv.keys[0]) and torch.equal(v0, kv.values[0])
        assert torch.equal(entry.layer(1)[1], kv.values[1])
        with pytest.raises(EntryError, match="checksum mismatch in v.2"):
            entry.layer(2)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d[: len(d) // 2], id="truncated-half"),
        pytest.param(lambda d: d[:-1], id="truncated-one-byte"),
        pytest.param(lambda d: d[:5], id="truncated-in-length"),
        pytest.param(lambda d: b"", id="empty"),
        pytest.param(lambda d: _flip(d, len(d) - 3), id="bit-flip-in-data"),
        pytest.param(lambda d: _flip(d, 60), id="bit-flip-in-header"),
        pytest.param(lambda d: b"\x00" * len(d), id="zeros"),
        pytest.param(lambda d: b"PK\x03\x04" + d[4:], id="zip-magic"),
    ],
)
def test_damaged_entries_raise_entry_error(damage):
    data = encode(KEY, make_kv(4))
    with pytest.raises(EntryError):
        decode(damage(data), KEY)


def test_foreign_entries_raise_entry_error():
    kv = make_kv(5)
    with pytest.raises(EntryError, match="foreign"):
        decode(safetensors.torch.save({"k.0": kv.keys[0]}), KEY)
    with pytest.raises(EntryError, match="another key|written for key"):
        decode(encode("b" * 64, kv), KEY)


def test_other_format_version_is_refused():
    data = encode(KEY, make_kv(6))
    tensors = safetensors.torch.load(data)
    with open_entry(data, KEY) as entry:
        assert entry.num_layers == 3
    header_len = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + header_len])["__metadata__"]
    meta["version"] = str(SIGNED_VERSION + 1)  # past every version this build reads
    with pytest.raises(EntryError, match="format version"):
        decode(safetensors.torch.save(tensors, metadata=meta), KEY)


def test_entries_of_the_previous_version_still_read():
    """Version 2 named the profile tensor "sensitivity" and the context tag field "context"."""
    kv = make_kv(7, profile=True)
    kv = ChunkKV(kv.keys, kv.values, kv.token_ids, kv.prefix_hash, kv.profile, "fill3-abc",
                 torch.rand(kv.num_layers, kv.num_tokens))
    data = encode(KEY, kv)
    tensors = safetensors.torch.load(data)
    tensors["sensitivity"] = tensors.pop("profile")
    header_len = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + header_len])["__metadata__"]
    meta["version"], meta["context"] = "2", meta.pop("context_tag")
    checksums = json.loads(meta["checksums"])
    checksums["sensitivity"] = checksums.pop("profile")
    meta["checksums"] = json.dumps(checksums)
    del meta["meta_checksum"]
    meta["meta_checksum"] = meta_digest(meta)
    old = decode(safetensors.torch.save(tensors, metadata=meta), KEY)
    assert same_bits(old, kv) and old.context_tag == "fill3-abc"
    assert torch.equal(old.context_shift, kv.context_shift)
    with open_entry(safetensors.torch.save(tensors, metadata=meta), KEY) as entry:
        assert torch.equal(entry.read_priors()[0], kv.profile)


def test_only_float_kv_dtypes_are_storable():
    kv = ChunkKV(torch.zeros(1, 1, 2, 2, dtype=torch.int32),
                 torch.zeros(1, 1, 2, 2, dtype=torch.int32), (1, 2))
    with pytest.raises(ValueError, match="not storable"):
        encode(KEY, kv)


def test_empty_chunk_round_trips():
    kv = make_kv(7, tokens=0)
    out = decode(encode(KEY, kv), KEY)
    assert out.num_tokens == 0 and same_bits(out, kv)


def test_file_truncated_while_open_is_an_entry_error_not_a_crash(tmp_path):
    # A memory-mapped reader would die of SIGBUS here; positioned reads see a short read.
    path = tmp_path / "entry.safetensors"
    path.write_bytes(encode(KEY, make_kv(8, layers=4, tokens=256)))
    with open_entry(path, KEY) as entry:
        entry.layer(0)
        os.truncate(path, path.stat().st_size // 2)
        with pytest.raises(EntryError, match="truncated"):
            entry.read_all()


def test_official_safetensors_reader_reads_our_files(tmp_path):
    kv = make_kv(9, dtype=torch.bfloat16)
    path = tmp_path / "entry.safetensors"
    path.write_bytes(encode(KEY, kv))
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["key"] == KEY and json.loads(f.metadata()["token_ids"]) == list(
            kv.token_ids
        )
        assert torch.equal(f.get_tensor("k.1"), kv.keys[1])


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda h: h["k.0"].update(data_offsets=[0, 10**12]), id="offset-past-end"),
        pytest.param(lambda h: h["k.0"].update(shape=[2, 8, 8]), id="shape-vs-bytes"),
        pytest.param(lambda h: h["k.0"].update(dtype="I64"), id="unknown-dtype"),
        pytest.param(lambda h: h["v.1"].update(dtype="F16", shape=[2, 8, 32]), id="dtype-swap"),
        pytest.param(lambda h: h.pop("v.2"), id="missing-layer"),
        pytest.param(lambda h: h["k.0"].pop("shape"), id="missing-field"),
        pytest.param(lambda h: (h["k.0"].update(data_offsets=h["k.1"]["data_offsets"])),
                     id="aliased-offsets"),
    ],
)
def test_malformed_headers_raise_entry_error(edit):
    data = encode(KEY, make_kv(10))
    with pytest.raises(EntryError):
        decode(rewrite_header(data, edit), KEY)
