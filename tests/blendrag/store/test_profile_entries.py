"""Entries with a context-sensitivity profile (``ChunkKV.profile``): the codec keeps it
bitwise and checksummed, every tier returns it, and the RAM budget counts it."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.codec import PROFILE, decode, encode, open_entry
from blendrag.store.errors import EntryError
from blendrag.store.ram import MemoryKVStore, held_bytes
from helpers.kvgen import make_kv, rewrite_header, same_bits, same_profile
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

KEY = "c" * 64
T = 8  # make_kv's default tokens


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _data_offsets(data: bytes, name: str) -> tuple[int, int]:
    """Absolute byte range of tensor ``name`` in an encoded entry."""
    n = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


# ---- codec -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_profile_round_trips_bitwise_from_bytes_path_and_handle(dtype, tmp_path):
    kv = make_kv(1, dtype=dtype, profile=True)
    # bits, not just values
    kv.profile[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])
    data = encode(KEY, kv)
    path = tmp_path / "entry.safetensors"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        outs = [decode(data, KEY), decode(path, KEY), decode(handle, KEY)]
    for out in outs:
        assert out.profile is not None and out.profile.dtype == torch.float32
        assert out.profile.shape == (T,)
        assert torch.equal(_bits(out.profile), _bits(kv.profile))
        assert same_bits(out, kv)


def test_entry_without_profile_decodes_to_none_and_has_no_profile_tensor():
    kv = make_kv(2)
    data = encode(KEY, kv)
    assert PROFILE not in safetensors.torch.load(data)
    out = decode(data, KEY)
    assert out.profile is None and same_bits(out, kv)
    with open_entry(data, KEY) as entry:
        assert PROFILE not in entry.priors


def test_profile_is_one_plain_float32_tensor_and_layers_read_without_it():
    kv = make_kv(3, profile=True)
    data = encode(KEY, kv)
    tensors = safetensors.torch.load(data)  # any safetensors reader sees it
    assert sorted(tensors) == sorted([PROFILE, *(f"{k}.{i}" for i in range(3) for k in "kv")])
    assert tensors[PROFILE].dtype == torch.float32 and torch.equal(
        tensors[PROFILE], kv.profile
    )
    with open_entry(data, KEY) as entry:
        assert PROFILE in entry.priors
        k1, v1 = entry.layer(1)
        assert torch.equal(k1, kv.keys[1]) and torch.equal(v1, kv.values[1])


def test_a_non_float32_profile_is_stored_as_float32():
    base = make_kv(4)
    profile = torch.linspace(0, 7, T, dtype=torch.float64)
    kv = ChunkKV(base.keys, base.values, base.token_ids, base.prefix_hash, profile)
    out = decode(encode(KEY, kv), KEY)
    assert out.profile.dtype == torch.float32
    assert out.profile.tolist() == [float(x) for x in range(8)]


def test_empty_chunk_with_an_empty_profile_round_trips():
    kv = make_kv(5, tokens=0, profile=True)
    out = decode(encode(KEY, kv), KEY)
    assert out.num_tokens == 0 and out.profile is not None and out.profile.shape == (0,)


@pytest.mark.parametrize("at", [0, 13, -1], ids=["first-byte", "middle", "last-byte"])
def test_a_flipped_byte_in_the_profile_is_a_checksum_error(at):
    kv = make_kv(6, profile=True)
    data = bytearray(encode(KEY, kv))
    start, end = _data_offsets(bytes(data), PROFILE)
    assert end - start == 4 * T
    data[(start if at >= 0 else end) + at] ^= 0xFF
    with pytest.raises(EntryError, match="checksum mismatch in profile"):
        decode(bytes(data), KEY)
    with open_entry(bytes(data), KEY) as entry:  # the layers themselves are intact
        assert torch.equal(entry.layer(0)[0], kv.keys[0])


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda h: h.pop(PROFILE), id="tensor-dropped"),
        pytest.param(
            lambda h: h[PROFILE].update(dtype="F16", shape=[2 * T]), id="dtype-and-shape"
        ),
        pytest.param(lambda h: h[PROFILE].update(dtype="I32"), id="int-dtype"),
        pytest.param(
            lambda h: h["__metadata__"].update(
                checksums=json.dumps(
                    {
                        k: v
                        for k, v in json.loads(h["__metadata__"]["checksums"]).items()
                        if k != PROFILE
                    }
                )
            ),
            id="checksum-dropped",
        ),
    ],
)
def test_a_tampered_profile_header_is_an_entry_error(edit):
    data = rewrite_header(encode(KEY, make_kv(7, profile=True)), edit)
    with pytest.raises(EntryError):
        decode(data, KEY)


def test_a_profile_tensor_planted_in_an_entry_without_one_is_refused():
    kv = make_kv(8)
    tensors = safetensors.torch.load(encode(KEY, kv))
    n = int.from_bytes(encode(KEY, kv)[:8], "little")
    meta = json.loads(encode(KEY, kv)[8 : 8 + n])["__metadata__"]
    tensors[PROFILE] = torch.ones(T)  # metadata (checksums) untouched: no entry for it
    with pytest.raises(EntryError, match="tensor names"):
        decode(safetensors.torch.save(tensors, metadata=meta), KEY)


# ---- RAM accounting ----------------------------------------------------------------------------


def test_held_bytes_counts_the_profile_and_nbytes_does_not():
    plain, profiled = make_kv(9), make_kv(9, profile=True)
    assert plain.nbytes == profiled.nbytes == 2 * 3 * 2 * T * 16 * 4
    assert held_bytes(plain) == plain.nbytes
    assert held_bytes(profiled) == plain.nbytes + 4 * T


def test_memory_store_budget_counts_profiles_and_replacements():
    plain, profiled = make_kv(10), make_kv(10, profile=True)
    ram = MemoryKVStore(max_bytes=plain.nbytes)  # room for the rows, not for rows + profile
    ram.put("k", profiled)
    assert len(ram) == 0 and ram.bytes == 0
    ram.put("k", plain)
    assert ram.bytes == plain.nbytes
    big = MemoryKVStore(max_bytes=1 << 20)
    big.put("k", plain)
    big.put("k", profiled)  # what the engine does when it profiles a stored chunk on first use
    assert big.bytes == held_bytes(profiled) and big.get("k").profile is profiled.profile
    big.delete("k")
    assert big.bytes == 0


# ---- tiers -------------------------------------------------------------------------------------


def test_ram_tier_returns_the_profile_and_counts_its_bytes(make_store):
    store = make_store(disk_dir=None)
    kv = make_kv(11, profile=True)
    store.put("k", kv)
    got = store.get("k")
    assert same_profile(got, kv) and torch.equal(got.profile, kv.profile)
    ram = store.stats().tier("ram")
    assert ram.used_bytes == ram.bytes_written == ram.bytes_read == held_bytes(kv)


def test_an_entry_that_fits_ram_only_without_its_profile_stays_on_disk(make_store):
    kv = make_kv(12, profile=True)
    store = make_store(ram_bytes=kv.nbytes)
    store.put("k", kv)
    s = store.stats()
    assert (s.tier("ram").entries, s.tier("disk").entries) == (0, 1)
    assert torch.equal(store.get("k").profile, kv.profile)


def test_disk_round_trip_and_promotion_to_ram_keep_the_profile(make_store):
    kv = make_kv(13, profile=True)
    make_store().put("k", kv, ram=False)
    reader = make_store()  # fresh RAM tier on the same directory
    first = reader.get("k")
    assert first.profile is not None and torch.equal(_bits(first.profile),
                                                         _bits(kv.profile))
    assert same_bits(first, kv)
    s = reader.stats()
    assert (s.tier("disk").hits, s.tier("ram").entries, s.tier("ram").bytes_written) == (
        1,
        1,
        held_bytes(kv),
    )
    second = reader.get("k")  # served by RAM now
    assert second is first and reader.stats().tier("ram").hits == 1
    assert torch.equal(second.profile, kv.profile)


def test_replacing_an_entry_with_its_profiled_version_updates_every_tier(make_store):
    plain, profiled = make_kv(14), make_kv(14, profile=True)
    store = make_store()
    store.put("k", plain)
    assert store.get("k").profile is None
    store.put("k", profiled)
    assert torch.equal(store.get("k").profile, profiled.profile)
    assert store.stats().tier("ram").used_bytes == held_bytes(profiled)
    assert torch.equal(make_store().get("k").profile, profiled.profile)  # disk has it too


def test_redis_round_trip_and_promotion_keep_the_profile(make_store, redis_server, redis_prefix,
                                                         tmp_path):
    kv = make_kv(15, profile=True)
    make_store(disk_dir=None, redis_url=redis_server.url, redis_prefix=redis_prefix).put("k", kv)
    store = make_store(disk_dir=tmp_path / "disk", redis_url=redis_server.url,
                       redis_prefix=redis_prefix)
    got = store.get("k")  # Redis hit, promoted to disk and RAM
    assert got.profile is not None and torch.equal(_bits(got.profile),
                                                       _bits(kv.profile))
    s = store.stats()
    assert (s.tier("redis").hits, s.tier("disk").entries, s.tier("ram").entries) == (1, 1, 1)
    disk_only = make_store(disk_dir=tmp_path / "disk", ram_bytes=0)
    assert same_bits(disk_only.get("k"), kv)
    plain = make_store(disk_dir=None, redis_url=redis_server.url, redis_prefix=redis_prefix)
    plain.put("p", make_kv(16))
    assert plain.get("p").profile is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_entry_made_of_gpu_tensors_is_stored_and_read_with_its_profile_on_the_cpu(
        make_store):
    kv = make_kv(17, profile=True)
    on_gpu = ChunkKV(kv.keys.cuda(), kv.values.cuda(), kv.token_ids, kv.prefix_hash,
                     kv.profile.cuda())
    assert on_gpu.profile.device.type == "cpu"  # ChunkKV keeps its profile on the CPU
    store = make_store()
    store.put("k", on_gpu)
    assert store.get("k").profile.device.type == "cpu"
    assert same_bits(make_store().get("k"), kv)


# ---- with the engine ---------------------------------------------------------------------------


def test_profiles_precomputed_by_one_process_serve_another(model_dir, tmp_path, one_thread):
    """Profiles written by precompute come back from disk: the profile selector measures none."""
    config = StoreConfig(ram_bytes=1 << 20, disk_dir=tmp_path / "kv", disk_bytes=8 << 20)
    with TieredKVStore(config) as store:
        writer = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                             store=store)
        layout = writer.build_prompt(PREFIX, PASSAGES, SUFFIX)
        writer.precompute(layout.chunk_prefix_ids, layout.chunk_ids, profile=True)
        written = [store.get(writer.key(layout.chunk_prefix_ids,
                                        ids)).profile for ids in layout.chunk_ids]
    with TieredKVStore(config) as store:
        reader = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                             store=store)
        stats = reader.prefill(layout, BlendConfig(selector="profile", ratio=0.3)).stats
        cache = stats.cache
        assert (cache.chunk_hits, cache.chunk_misses, cache.profiles_computed) == (
            len(PASSAGES), 0, 0)
        read = [store.get(reader.key(layout.chunk_prefix_ids,
                                     ids)).profile for ids in layout.chunk_ids]
    assert all(torch.equal(a, b) for a, b in zip(written, read))
    assert all(s.max() > 0 for s in read)
