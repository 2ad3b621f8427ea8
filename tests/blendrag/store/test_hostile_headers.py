"""Entry headers that parse as JSON but hold what no tensor has (infinite, NaN, negative or
overflowing sizes and offsets, nesting deep enough to exhaust a recursive parser), with store
keys and without: a counted miss at ``get``, ``open_layers``, a request's prefill and ``cache
stats``, never an exception; the entry is dropped and stored again by the next write; and a
refused header is not parsed again."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from blendrag import BlendConfig
from blendrag.cli import cache as store_cli
from blendrag.store import codec, entry_reader
from blendrag.store.auth import StoreKeys
from blendrag.store.disk import DiskTier
from blendrag.store.errors import EntryError
from helpers.kvgen import make_kv, same_bits
from helpers.mutations import hostile_header
from helpers.tiny import PREFIX, SUFFIX

KEYS = StoreKeys({"k1": b"signing-secret-one-0123456789"}, "k1")
HOSTILE = [("data_offsets", "1e999"), ("data_offsets", "Infinity"), ("data_offsets", "NaN"),
           ("data_offsets", "-1"), ("data_offsets", str(10**40)), ("shape", "-Infinity"),
           ("shape", str(2**64)), ("shape", "1" + "0" * 5000), ("meta:shape", "1e999"),
           ("meta:shape", str(10**40)), ("meta:token_ids", "NaN"), ("meta:shape", "deep"),
           ("meta:token_ids", "deep"), ("deep", "")]


def _unsigned(data: bytes) -> bytes:
    """``data`` with its header tag's name changed: read as an older (version-5) or unsigned
    entry, whose header a keyed store must parse to judge."""
    return data.replace(b'"header_tag":', b'"header_taf":', 1)


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
@pytest.mark.parametrize(("where", "value"), HOSTILE)
def test_a_hostile_header_is_a_counted_miss_dropped_and_rewritten(make_store, keys, where,
                                                                  value):
    store = make_store(auth_key=keys)
    store.put("k", make_kv(1))
    tier = store.tiers[1].tier
    name = store.stored_name("k")
    for variant in ([lambda d: d] if keys is None else [lambda d: d, _unsigned]):
        valid = codec.encode(name, make_kv(1), signer=keys)
        tier.put(name, hostile_header(variant(valid), where, value))
        store.tiers[0].tier.delete(name)  # the RAM tier in front holds the valid rows
        assert store.get("k") is None and store.open_layers("k") is None  # no exception
        assert store.stats().tier("disk").corrupt >= 1
        assert store.missing(["k"]) == ["k"]  # dropped: to be computed again
        store.put("k", make_kv(1))
        store.tiers[0].tier.delete(name)
        assert same_bits(store.get("k"), make_kv(1))
    assert store.stats().auth_failures == 0


def _fetch(tier, name: str) -> bytes | None:
    found = tier.fetch(name)
    if found is None or isinstance(found, bytes):
        return found
    with found:
        return found.read()


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_a_request_over_hostile_headers_gets_the_cold_logits(engine_for, make_store, tmp_path,
                                                            keys, one_thread):
    config = BlendConfig(selector="cacheblend", ratio=0.3)
    chunks = ["fact one.", "fact two.", "fact three.", "fact four."]
    engine = engine_for("llama", layers=2)
    engine.store = make_store(ram_bytes=0, auth_key=keys)
    layout = engine.build_prompt(PREFIX, chunks, SUFFIX)
    engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)
    tier = engine.store.tiers[0].tier
    for i, ids in enumerate(layout.chunk_ids):
        name = engine.store.stored_name(engine.key(layout.chunk_prefix_ids, ids))
        where, value = HOSTILE[i * 3 % len(HOSTILE)]
        tier.put(name, hostile_header(_fetch(tier, name) or b"", where, value))
    cold = engine_for("llama", layers=2)
    cold.store = make_store(ram_bytes=0, disk_dir=tmp_path / "cold")
    ref = cold.prefill(layout, config)

    pre = engine.prefill(layout, config)
    assert torch.equal(pre.logits, ref.logits)
    assert pre.stats.cache.chunk_misses == len(chunks)
    again = engine.prefill(layout, config)  # stored again
    assert again.stats.cache.chunk_hits == len(chunks)
    assert torch.equal(again.logits, ref.logits)


def test_cache_stats_over_hostile_headers(make_store, tmp_path, capsys):
    store = make_store(ram_bytes=0)
    tier = store.tiers[0].tier
    for i, (where, value) in enumerate(HOSTILE):
        store.put(f"k{i}", make_kv(i))
        name = store.stored_name(f"k{i}")
        tier.put(name, hostile_header(_fetch(tier, name) or b"", where, value))
    store.put("valid", make_kv(99))
    parser = argparse.ArgumentParser(prog="blendrag")
    store_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--json"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["disk"]["entries"] == len(HOSTILE) + 1
    assert same_bits(store.get("valid"), make_kv(99))


def test_a_refused_header_is_not_parsed_again(make_store, monkeypatch):
    store = make_store(ram_bytes=0, auth_key=KEYS)
    store.put("k", make_kv(1, tokens=64))
    tier = store.tiers[0].tier
    name = store.stored_name("k")
    # a forgery: a header of valid JSON that is not signed with this store's keys, kept
    forged = codec.encode(name, make_kv(2, tokens=64))
    tier.put(name, forged)
    parsed = []
    loads = entry_reader.headers.loads

    def counted(raw):
        parsed.extend([1] if isinstance(raw, bytes) else [])  # the header, not its fields
        return loads(raw)

    monkeypatch.setattr(entry_reader.headers, "loads", counted)
    for _ in range(5):
        assert store.get("k") is None and store.open_layers("k") is None
    assert len(parsed) == 1  # the first read parsed it; every later one knew it refused
    assert store.stats().auth_failures == 10  # still counted at every read
    assert _fetch(tier, name) == forged  # and left as it is
    assert DiskTier(store.config.disk_dir, None).entry_path(name) is not None


def test_a_header_larger_than_its_data_can_need_is_refused_unread():
    from blendrag.store.readers import BufferReader

    data = codec.encode("k", make_kv(1))
    n = int.from_bytes(data[:8], "little")
    padded = data[8:8 + n] + b" " * (3 << 20)  # valid JSON: trailing spaces
    big = len(padded).to_bytes(8, "little") + padded + data[8 + n:]
    reads = []

    class Counted(BufferReader):
        def read(self, offset: int, size: int) -> bytes:
            reads.append(size)
            return super().read(offset, size)

    with pytest.raises(EntryError, match="bytes of data"):
        codec.open_entry(Counted(big), "k")
    assert reads == [8]  # the length alone refused it
    assert same_bits(codec.decode(data, "k"), make_kv(1))


def test_an_accepted_header_is_parsed_again_without_its_checks_to_the_same_values(
        monkeypatch):
    """A text that passed ``loads``' checks is remembered by its exact bytes: parsed again, it
    gives equal values, fresh ones (a caller's change is not seen by the next), without the
    checks; a text one byte apart is checked (and refused) as any other; the memory is
    bounded."""
    from blendrag.store import header as headers

    memo = headers.Accepted(max_bytes=4000)
    monkeypatch.setattr(headers, "ACCEPTED", memo)
    checked = []
    strict = headers._strict
    monkeypatch.setattr(headers, "_strict", lambda raw: checked.append(raw) or strict(raw))
    text = b'{"a": [1, 2, {"b": "c"}], "n": 9223372036854775807}'
    first = headers.loads(text)
    again = headers.loads(text)
    assert first == again and first is not again and checked == [text]
    again["a"].append(3)
    assert headers.loads(text) == first
    for hostile in (text.replace(b"807", b"808"), text.replace(b"1,", b"1.5,"),
                    text.replace(b'"c"', b"NaN")):  # past MAX_INT, a float, a constant
        for _ in range(2):
            with pytest.raises(EntryError):
                headers.loads(hostile)
        assert not memo.holds(hostile)
    assert checked.count(text) == 1
    nested = b"[" * 9 + b"]" * 9  # deeper than MAX_DEPTH
    with pytest.raises(EntryError, match="nested"):
        headers.loads(nested)
    assert len(memo) == 1
    texts = [b'{"k": "%s"}' % (b"x" * 90 + str(i).encode()) for i in range(40)]
    for t in texts:  # each takes its object and its node: the oldest forgotten past 4,000
        headers.loads(t)
    assert memo._bytes == sum(map(headers.held, [t for t in texts if memo.holds(t)])) <= 4000
    assert not memo.holds(text) and memo.holds(texts[-1]) and not memo.holds(texts[0])
    wide = '"%s"' % ("\U0001f600" * 300)  # 300 characters of 4 bytes: over a quarter
    assert headers.held(wide) > 1000
    headers.loads(wide)
    assert not memo.holds(wide)


def _entry_of(key: str, shape: list[int], version: str = "4") -> bytes:
    """An entry whose metadata and checksums are consistent, of ``shape`` [L, H, T, D] with
    no token (T = 0: every tensor holds no bytes), at format ``version``."""
    from blendrag.store.entry_format import digest, meta_digest

    layers, heads, _, dim = shape
    meta = {"format": "blendrag-chunk-kv", "version": version, "key": key, "prefix_hash": "",
            "context_tag": "", "dtype": "float32", "stored": "float32",
            "shape": json.dumps(shape), "token_ids": "[]",
            "checksums": json.dumps({f"{k}.{i}": digest(torch.empty(0))
                                     for i in range(layers) for k in "kv"})}
    meta["meta_checksum"] = meta_digest(meta)
    header: dict = {f"{k}.{i}": {"dtype": "F32", "shape": [heads, 0, dim],
                                 "data_offsets": [0, 0]}
                    for i in range(layers) for k in "kv"}
    header["__metadata__"] = meta
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


@pytest.mark.parametrize(("shape", "version"), [
    ([2, 1 << 40, 0, 1 << 40], "4"),  # no bytes, so no byte range bounds H x D
    ([2, 1 << 61, 0, 8], "4"),
    ([2, 2, 0, 4], "\u00b2"),  # a digit to str.isdigit that int() refuses
], ids=["huge-rows", "huge-heads", "superscript-version"])
@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_a_planted_entry_of_no_bytes_or_an_odd_version_is_a_miss(make_store, keys, shape,
                                                                 version):
    store = make_store(ram_bytes=0, auth_key=keys)
    name = store.stored_name("k")
    planted = _entry_of(name, shape, json.loads(f'"{version}"'))
    with pytest.raises(EntryError):
        codec.decode(planted, name)
    store.tiers[0].tier.put(name, planted)
    assert store.get("k") is None and store.open_layers("k") is None  # no exception
    store.put("k", make_kv(1))
    assert same_bits(store.get("k"), make_kv(1))
