"""Authenticated entries in every byte tier (disk, Redis, Redis Cluster, S3, on the real servers
the suite starts): with store keys, a forged, foreign or unsigned entry is a miss - no exception,
never promoted into RAM, never deleted, never overwritten - and counted; keys rotate; entries
encrypted at rest hold no plaintext."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from blendrag.store.auth import StoreKeys
from blendrag.store.codec import decode, encode
from blendrag.store.errors import AuthError
from blendrag.store.layered import LayerReadError
from helpers.backends import BYTE_KINDS, Backend
from helpers.kvgen import make_kv, same_bits

NAMING = b"naming-secret-never-rotated-0123"
KEYS = StoreKeys({"names": NAMING, "k1": b"signing-secret-one-0123456789"}, "k1",
                 naming="names")
ATTACKER = StoreKeys({"k1": b"an-attackers-own-secret-012345"}, "k1")  # the right id, wrong key


@pytest.fixture(params=BYTE_KINDS)
def backend(request, tmp_path) -> Backend:
    return Backend(request.param, request, tmp_path)


def _flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


FORGERIES = {
    # name: (the key read, what is written under its stored name, given the valid bytes of "a")
    "missing tag": ("a", lambda s, valid: encode(s.stored_name("a"), make_kv(99))),
    "bad tag": ("a", lambda s, valid: encode(s.stored_name("a"), make_kv(99), signer=ATTACKER)),
    "copied from a to b": ("b", lambda s, valid: valid),
    "copied across tenants": ("a", lambda s, valid: valid),  # read in another namespace
    "retired key": ("a", lambda s, valid: encode(s.stored_name("a"), make_kv(99), signer=(
        StoreKeys({"names": NAMING, "k0": b"retired-secret-0123456789ab"}, "k0",
                  naming="names")))),
}


# Damage, not forgery: the entry's own checks fail (a keyed store rewrites it).
DAMAGE = {
    "flipped payload bit": _flip,
    "truncated": lambda valid: valid[: len(valid) * 2 // 3],
    "oversized": lambda valid: valid + bytes(4096),
    "flipped header byte": lambda valid: valid[:40] + bytes([valid[40] ^ 4]) + valid[41:],
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_entry_in_a_keyed_store_is_a_miss_reported_missing_and_rewritten(backend,
                                                                                   case):
    writer = backend.store(auth_key=KEYS)
    writer.put("a", make_kv(1))
    name = writer.stored_name("a")
    damaged = DAMAGE[case](Backend.fetch(writer, name))
    Backend.put(writer, name, damaged)
    reader = backend.store(auth_key=KEYS, ram_bytes=1 << 20)

    assert reader.get("a") is None  # a miss, no exception, never promoted
    assert not reader.tiers[0].tier.contains(name)
    # the backend is the last tier, after RAM (a Redis Cluster is a "redis" tier)
    assert reader.stats().auth_failures == 0 and reader.stats().tiers[-1].corrupt == 1
    assert reader.missing(["a"]) == ["a"]  # known damaged: to be computed again
    reader.put("a", make_kv(2))
    assert same_bits(backend.store(auth_key=KEYS).get("a"), make_kv(2))
    writer.close()
    reader.close()


@pytest.mark.parametrize("case", list(FORGERIES))
def test_a_forged_entry_is_a_miss_never_used_promoted_deleted_or_overwritten(backend, case):
    keys = KEYS
    if case == "retired key":
        keys = dataclasses.replace(KEYS, retired=("k0",))
    writer = backend.store(auth_key=keys)
    writer.put("a", make_kv(1))
    valid = Backend.fetch(writer, writer.stored_name("a"))
    target, forge = FORGERIES[case]
    reader = backend.store(auth_key=keys, ram_bytes=1 << 20)  # RAM in front: promotion shows
    if case == "copied across tenants":
        reader = reader.namespaced("tenant-b")
    name = reader.stored_name(target)
    forged = forge(writer, valid)
    Backend.put(writer, name, forged)

    assert reader.get(target) is None  # a miss, no exception
    entry = reader.open_layers(target)
    if entry is not None:  # a payload defect shows as its layer is read: never served
        with pytest.raises(LayerReadError):
            for i in range(entry.num_layers):
                entry.layer(i)
        entry.close()
    assert reader.stats().auth_failures >= 1
    assert not reader.tiers[0].tier.contains(name)  # not promoted into RAM
    assert Backend.fetch(writer, name) == forged  # still there, as it was
    reader.put(target, make_kv(2))  # this process computed the chunk: it stores it...
    if case == "retired key":  # ...over an entry of a retired key: rewritten under the new one
        assert same_bits(reader.get(target), make_kv(2))
    else:  # ...never over a forgery (it may be a valid entry under a key this process lacks)
        assert Backend.fetch(writer, name) == forged
    writer.close()
    reader.close()


def test_a_forged_entry_is_read_and_counted_at_every_request_and_warned_once(backend,
                                                                              caplog):
    writer = backend.store(auth_key=KEYS)
    Backend.put(writer, writer.stored_name("a"),
                encode(writer.stored_name("a"), make_kv(99), signer=ATTACKER))
    reader = backend.store(auth_key=KEYS)
    with caplog.at_level("DEBUG", logger="blendrag.store"):
        for _ in range(3):
            assert reader.get("a") is None
    said = [r for r in caplog.records if "is not authenticated" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "DEBUG", "DEBUG"]
    assert reader.stats().auth_failures == 3  # each read checked: a valid rewrite would hit
    writer.close()
    reader.close()


def test_a_signed_entry_round_trips_and_its_tag_covers_the_key(backend):
    store = backend.store(auth_key=KEYS, ram_bytes=1 << 20)
    kv = make_kv(3, profile=True)
    store.put("a", kv)
    fresh = backend.store(auth_key=KEYS)
    assert same_bits(fresh.get("a"), kv) and fresh.stats().auth_failures == 0
    entry = fresh.open_layers("a")
    assert entry is not None
    assert all(torch.equal(entry.layer(i)[0], kv.keys[i]) for i in range(kv.num_layers))
    entry.close()
    data = Backend.fetch(fresh, fresh.stored_name("a"))
    with pytest.raises(AuthError):  # the tag binds the name: the same bytes under another fail
        decode(data, fresh.stored_name("b"), KEYS)
    store.close()
    fresh.close()


def test_an_unkeyed_store_reads_signed_entries_and_a_keyed_one_refuses_unsigned(backend):
    plain = backend.store()
    plain.put("a", make_kv(4))
    keyed = backend.store(auth_key=KEYS)
    name = keyed.stored_name("a")
    Backend.put(keyed, name, Backend.fetch(plain, plain.stored_name("a")) or b"")
    assert keyed.get("a") is None and keyed.stats().auth_failures == 1
    keyed.put("b", make_kv(5))
    signed = Backend.fetch(keyed, keyed.stored_name("b"))
    Backend.put(plain, "b-copy", signed or b"")
    # without keys, a signed entry is read as any other (its SHA-256 digests still checked)
    assert decode(signed or b"", keyed.stored_name("b")) is not None
    plain.close()
    keyed.close()


def test_keys_rotate_an_accepted_old_key_hits_a_retired_one_misses(backend):
    v1 = KEYS
    old = backend.store(auth_key=v1)
    old.put("a", make_kv(6))
    v2 = StoreKeys({**v1.secrets, "k2": b"signing-secret-two-0123456789"}, "k2", naming="names")
    during = backend.store(auth_key=v2)  # k2 signs, k1 still accepted
    assert same_bits(during.get("a"), make_kv(6))
    during.put("b", make_kv(7))
    v3 = StoreKeys({"names": NAMING, "k2": v2.secrets["k2"]}, "k2", naming="names",
                   retired=("k1",))
    after = backend.store(auth_key=v3)
    assert same_bits(after.get("b"), make_kv(7))  # signed with k2: a hit
    assert after.get("a") is None and after.stats().auth_failures == 1  # k1 retired: a miss
    after.put("a", make_kv(6))  # rewritten under k2
    assert same_bits(backend.store(auth_key=v3).get("a"), make_kv(6))
    for s in (old, during, after):
        s.close()


def test_encrypted_entries_hold_no_plaintext_and_never_reuse_a_nonce(backend):
    pytest.importorskip("cryptography", reason="pip install 'blendrag[crypto]'")
    from blendrag.store.sealed import MAGIC, NONCE

    store = backend.store(auth_key=KEYS, encrypt=True, ram_bytes=1 << 20)
    kv = make_kv(8, tokens=32)
    store.put("a", kv)
    store.put("b", kv)  # the same rows twice
    fresh = backend.store(auth_key=KEYS, encrypt=True)
    assert same_bits(fresh.get("a"), kv) and same_bits(fresh.get("b"), kv)
    entry = fresh.open_layers("a")
    assert entry is not None and torch.equal(entry.layer(1)[1], kv.values[1])
    entry.close()
    blobs = [Backend.fetch(fresh, fresh.stored_name(k)) or b"" for k in ("a", "b")]
    ids = ",".join(str(t) for t in kv.token_ids).encode()
    for blob in blobs:
        assert blob.startswith(MAGIC) and ids not in blob and b"blendrag-chunk-kv" not in blob
        assert kv.keys[0].numpy().tobytes()[:64] not in blob
    start = len(MAGIC) + 1 + len(b"k1")
    assert blobs[0][start:start + NONCE] != blobs[1][start:start + NONCE]
    # moved under another name, or one bit flipped: a miss, left as it is
    Backend.put(fresh, fresh.stored_name("c"), blobs[0])
    Backend.put(fresh, fresh.stored_name("a"), _flip(blobs[0]))
    assert fresh.get("c") is None and fresh.get("a") is None
    assert fresh.stats().auth_failures == 2
    assert Backend.fetch(fresh, fresh.stored_name("a")) == _flip(blobs[0])
    store.close()
    fresh.close()


def test_keys_never_show_their_secrets_and_pickle_as_their_source(tmp_path, monkeypatch):
    secret = "73656372657420736563726574207365637265"  # hex
    monkeypatch.setenv("BLENDRAG_STORE_KEYS", f"main={secret},naming=main")
    keys = StoreKeys.from_env()
    assert secret not in repr(keys) and "secret" not in repr(keys).lower().replace(
        "secrets", "")
    assert b"secret" not in pickle.dumps(keys)  # the variable's name travels, not its value
    monkeypatch.setenv("BLENDRAG_STORE_KEYS", f"main={secret}")
    assert pickle.loads(pickle.dumps(keys)).secrets == keys.secrets
    path = tmp_path / "keys"
    path.write_text(f"# deployment keys\nk2={secret}\nmain={secret}\nretired=k0\n")
    from_file = StoreKeys.from_file(path)
    assert (from_file.active, from_file.retired) == ("k2", ("k0",))
    assert b"secret" not in pickle.dumps(from_file)
    for bad, message in (("k1=zz", "neither hex nor base64"), ("k1=00", "at least 16 bytes"),
                         ("nothing", "no '='"), ("bad id!=" + secret, "key id")):
        with pytest.raises(ValueError, match=message) as info:
            StoreKeys.parse(bad)
        assert secret not in str(info.value)


def test_a_replaced_copy_of_keys_pickles_with_every_role(tmp_path, monkeypatch):
    a, b, c = "61" * 16, "62" * 16, "63" * 16
    monkeypatch.setenv("BLENDRAG_STORE_KEYS", f"k1={a},k2={b},names={c},naming=names")
    path = tmp_path / "keys"
    path.write_text(f"k1={a}\nk2={b}\nnames={c}\nnaming=names\n")
    for keys in (StoreKeys.from_env(), StoreKeys.from_file(path), StoreKeys.parse(
            f"k1={a},k2={b},names={c},naming=names")):
        rotated = dataclasses.replace(keys, active="k2")
        retiring = dataclasses.replace(keys, secrets={"k2": bytes.fromhex(b),
                                                      "names": bytes.fromhex(c)},
                                       active="k2", retired=("k1",))
        for copy in (keys, rotated, retiring):
            back = pickle.loads(pickle.dumps(copy))
            assert (back.secrets, back.active, back.naming, back.retired) == (
                copy.secrets, copy.active, copy.naming, copy.retired)
            assert (bytes.fromhex(b) not in pickle.dumps(copy)) == (copy.source is not None)
        assert pickle.loads(pickle.dumps(rotated)).sign(b"m").startswith("k2:")
    # a key the source no longer holds: a clear error where the keys are unpickled
    pickled = pickle.dumps(dataclasses.replace(StoreKeys.from_env(), active="k2"))
    monkeypatch.setenv("BLENDRAG_STORE_KEYS", f"k1={a},names={c}")
    with pytest.raises(ValueError, match="no longer holds key") as info:
        pickle.loads(pickled)
    assert a not in str(info.value) and b not in str(info.value)


@pytest.mark.parametrize("kv_format", ["bfloat16", "float16", "int8"])
def test_signed_entries_of_every_stored_format_round_trip(tmp_path, kv_format):
    kv = make_kv(11, profile=True)
    data = encode("a", kv, kv_format, KEYS)
    plain = decode(encode("a", kv, kv_format), "a")  # the same rows, unsigned
    assert same_bits(decode(data, "a", KEYS), plain) and same_bits(decode(data, "a"), plain)


def _version_5(key: str, kv, keys: StoreKeys) -> bytes:
    """``kv`` as a build before version 6 signed it: an HMAC over the parsed metadata."""
    import json

    import safetensors.torch

    from blendrag.store.auth import signed_bytes
    from blendrag.store.codec import meta_digest

    data = encode(key, kv, "model", keys)
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n])["__metadata__"]
    del meta["header_tag"]
    meta["version"] = "5"
    del meta["meta_checksum"]
    meta["meta_checksum"] = meta_digest(meta)
    meta["auth"] = keys.sign(signed_bytes(meta))
    return safetensors.torch.save(safetensors.torch.load(data), metadata=meta)


def test_entries_signed_by_version_5_are_still_read_and_checked():
    kv = make_kv(12)
    old = _version_5("a", kv, KEYS)
    assert same_bits(decode(old, "a", KEYS), kv) and same_bits(decode(old, "a"), kv)
    with pytest.raises(AuthError):
        decode(old, "a", ATTACKER)  # another key
    with pytest.raises(AuthError):
        decode(old, "b", KEYS)  # another name
    with pytest.raises(AuthError):
        decode(_version_5("a", kv, ATTACKER), "a", KEYS)


def _retagged(data: bytes, tag: str) -> bytes:
    """A version-5 entry ``data`` with its ``auth`` tag replaced by ``tag``."""
    import json

    import safetensors.torch

    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n])["__metadata__"]
    meta["auth"] = tag
    return safetensors.torch.save(safetensors.torch.load(data), metadata=meta)


@pytest.mark.parametrize("tag", ["k1:\u00e9", "k1:" + "\u00e9" * 64, "k1:" + "A" * 64,
                                 "k1:" + "0" * 63])
def test_a_tag_that_is_no_hex_digest_is_refused_as_unauthenticated(tag):
    """compare_digest raises TypeError on non-ASCII text: a planted tag of any characters must
    be an AuthError (a counted miss), in every reader of tags."""
    planted = _retagged(_version_5("a", make_kv(12), KEYS), tag)
    with pytest.raises(AuthError):
        decode(planted, "a", KEYS)
    assert KEYS.verify(tag, b"message") == "malformed tag"
    assert KEYS.verify(tag + "\udc80", b"message") == "malformed tag"  # a lone surrogate
