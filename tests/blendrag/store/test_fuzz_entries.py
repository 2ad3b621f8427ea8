"""Fuzzing stored entries: real entries mutated (truncated, bytes flipped, headers spliced from
other entries, numbers grown past anything a tensor has, nesting deep enough to exhaust a
recursive parser, the header length swapped, the signature stripped: ``helpers.mutations``) and
read by every reader, with store keys and without. Whatever the bytes: no exception but
``EntryError`` (what a tier turns into a counted miss) leaves a reader, anything returned is
the original entry exactly, and no valid entry is deleted.

Per reader, 10,000 mutated entries go through the tier's own reader path (the codec over the
``RangeReader`` each tier reads through: an entry file for disk, a whole value for Redis and S3
gets and encrypted entries, Redis GETRANGE and S3 ranged GETs with read-ahead, the last two on
in-memory stand-ins of the servers), each read whole and layer by layer; then a few hundred
through a whole store on every byte tier the suite can start (disk here; Redis, Redis Cluster
and S3 where their servers run), where a miss, a deletion and a rewrite really happen. The RAM
tier holds decoded tensors, never bytes: nothing of it to mutate.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable

import pytest

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.auth import StoreKeys
from blendrag.store.codec import decode, encode, open_entry
from blendrag.store.errors import AuthError, EntryError
from blendrag.store.layered import EncodedLayeredEntry, LayerReadError
from blendrag.store.readers import BufferReader, FileReader, RangeReader
from blendrag.store.redis_tier import RedisRanges
from blendrag.store.s3_ranges import FetchPool, S3Ranges
from helpers.backends import BYTE_KINDS, Backend
from helpers.kvgen import make_kv, same_bits
from helpers.mutations import mutate

KEYS = StoreKeys({"k1": b"signing-secret-one-0123456789"}, "k1")
NAME = "entry-name"
PER_READER = 10_000  # mutated entries per reader, half of them read with keys
HEAD = 200  # what the ranged readers' opening read holds: later reads are ranged


def _originals(keys: StoreKeys | None) -> list[bytes]:
    """Real entries of several shapes and formats, signed with ``keys`` when given."""
    out = []
    for seed, fmt in enumerate(["model", "bfloat16", "int8", "float16"]):
        kv = make_kv(seed, layers=2 + seed % 2, tokens=3 + seed, dim=8, profile=seed % 2 == 0)
        out.append(encode(NAME, kv, fmt, keys))
    return out


class _FakeRedis:
    """GETRANGE and STRLEN over one value."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def getrange(self, name: str, start: int, end: int) -> bytes:
        return self.data[start:end + 1]

    def strlen(self, name: str) -> int:
        return len(self.data)


class _FakeS3:
    """Ranged GETs of one object."""

    class exceptions:  # noqa: N801 - boto3's spelling
        ClientError = type("ClientError", (Exception,), {"response": {}})

    def __init__(self, data: bytes) -> None:
        self.data = data

    def get_object(self, Bucket: str, Key: str, Range: str, IfMatch: str = "") -> dict:  # noqa: N803
        start, end = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        return {"Body": io.BytesIO(self.data[start:end + 1])}


def _readers(tmp_path, pool: FetchPool) -> dict[str, Callable[[bytes], RangeReader]]:
    path = tmp_path / "entry"

    def file_reader(data: bytes) -> RangeReader:
        path.write_bytes(data)
        return FileReader(path)

    return {
        "disk file": file_reader,
        "whole value (redis, s3, encrypted)": BufferReader,
        "redis getrange": lambda d: RedisRanges(_FakeRedis(d), NAME, len(d), d[:HEAD]),
        "s3 ranged get": lambda d: S3Ranges(_FakeS3(d), "bucket", NAME, len(d), "etag",
                                            d[:HEAD], pool),
    }


def _same(a: ChunkKV, b: ChunkKV) -> bool:
    return same_bits(a, b) and a.context_tag == b.context_tag


def _read_whole(make: Callable[[bytes], RangeReader], data: bytes,
                keys: StoreKeys | None) -> ChunkKV | None:
    try:
        with open_entry(make(data), NAME, keys) as entry:
            return entry.read_all()
    except EntryError:
        return None


def _read_layers(make: Callable[[bytes], RangeReader], data: bytes,
                 keys: StoreKeys | None) -> ChunkKV | None:
    try:
        reader = open_entry(make(data), NAME, keys)
    except EntryError:
        return None
    try:
        entry = EncodedLayeredEntry(reader, NAME, "fuzz")
    except EntryError:
        reader.close()
        return None
    try:
        for i in range(entry.num_layers):
            entry.layer(i)
        return entry.materialize()
    except EntryError:
        return None
    finally:
        entry.close()


@pytest.fixture(scope="module")
def pool():
    pool = FetchPool(2, name="fuzz-get")
    yield pool
    pool.close()


@pytest.mark.parametrize("reader", ["disk file", "whole value (redis, s3, encrypted)",
                                    "redis getrange", "s3 ranged get"])
def test_mutated_entries_through_every_reader_are_misses_or_the_original(reader, tmp_path,
                                                                         pool):
    make = _readers(tmp_path, pool)[reader]
    rng = random.Random(f"fuzz-{reader}")
    served = refused = 0
    for keys in (None, KEYS):
        originals = _originals(keys) + ([] if keys else _originals(KEYS))  # plain reads both
        expected = [decode(data, NAME, keys) for data in originals]
        for n in range(PER_READER // 2):
            i = rng.randrange(len(originals))
            data = mutate(originals[i], rng, originals)
            read = _read_layers if n % 2 else _read_whole
            got = read(make, data, keys)  # any exception but EntryError fails the test
            if got is None:
                refused += 1
            else:
                served += 1
                assert _same(got, expected[i]), f"wrong rows from {reader} (mutation {n})"
    assert served + refused == PER_READER
    assert refused > PER_READER // 2  # the mutations do damage: most are refused


def test_mutations_leave_the_readers_consistent_with_decode(tmp_path, pool):
    """The layered and ranged readers refuse what ``decode`` of the same bytes refuses."""
    rng = random.Random("agree")
    originals = _originals(KEYS)
    readers = _readers(tmp_path, pool)
    for _ in range(300):
        data = mutate(rng.choice(originals), rng, originals)
        try:
            decode(data, NAME, KEYS)
            whole = True
        except EntryError:
            whole = False
        for make in readers.values():
            assert (_read_whole(make, data, KEYS) is not None) == whole
            assert (_read_layers(make, data, KEYS) is not None) == whole


STORE_MUTATIONS = {"disk": 400}  # per store; a server round trip costs more
STORE_MUTATIONS_SERVER = 100


@pytest.fixture(params=BYTE_KINDS)
def backend(request, tmp_path) -> Backend:
    return Backend(request.param, request, tmp_path)


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_mutated_entries_in_a_store_are_counted_misses_and_no_valid_entry_is_deleted(
        backend, keys):
    store = backend.store(auth_key=keys, ram_bytes=0)
    kvs = {f"k{i}": make_kv(i, layers=2, tokens=4 + i, dim=8) for i in range(4)}
    for key, kv in [*kvs.items(), ("sentinel", make_kv(9))]:
        store.put(key, kv)
    sentinel = Backend.fetch(store, store.stored_name("sentinel"))
    valid = {key: Backend.fetch(store, store.stored_name(key)) or b"" for key in kvs}
    originals = list(valid.values())
    rng = random.Random(f"store-{backend.kind}")
    count = STORE_MUTATIONS.get(backend.kind, STORE_MUTATIONS_SERVER)
    deleted = 0
    for n in range(count):
        key = rng.choice(list(kvs))
        name = store.stored_name(key)
        data = mutate(valid[key], rng, originals)
        Backend.put(store, name, data)
        got = store.get(key) if n % 2 else _layers(store, key)  # no exception
        if got is not None:
            assert _same(got, kvs[key])  # never other rows
        if Backend.fetch(store, name) is None:  # deleted: only bytes that are not an entry
            deleted += 1
            with pytest.raises(EntryError) as refused:
                decode(data, name, keys)
            assert not isinstance(refused.value, AuthError)  # a forgery is never deleted
        Backend.put(store, name, valid[key])
    assert Backend.fetch(store, store.stored_name("sentinel")) == sentinel
    assert all(_same(store.get(key), kv) for key, kv in kvs.items())
    assert deleted > count // 4  # damage is dropped (and rewritten: the loop puts it back)
    store.close()


def _layers(store, key: str) -> ChunkKV | None:
    entry = store.open_layers(key)
    if entry is None:
        return None
    try:
        for i in range(entry.num_layers):
            entry.layer(i)
        return entry.materialize()
    except LayerReadError:
        return None
    finally:
        entry.close()
