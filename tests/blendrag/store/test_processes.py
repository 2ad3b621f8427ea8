"""Several processes on one disk tier: a reader sees a writer's entries, concurrent writers
agree."""

from __future__ import annotations

import pytest

from blendrag.store import DiskTier, StoreConfig, TieredKVStore
from helpers import procs
from helpers.kvgen import entry_bytes, make_kv, same_bits

pytestmark = pytest.mark.processes

KV = dict(layers=2, heads=2, tokens=32, dim=32)


def test_second_process_reads_what_the_first_wrote(tmp_path):
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", disk_bytes=8 << 20,
                                      kv_format="model"))
    seeds = [11, 12, 13]
    for s in seeds:
        store.put(f"key{s}", make_kv(s, **KV))
    store.close()
    out = procs.run("read",
                    {"dir": str(tmp_path / "kv"), "budget": 8 << 20,
                     "keys": ["key11", "key12", "key13", "nope"],
                             "seeds": seeds + [0], "kv": KV})
    assert out == {"key11": True, "key12": True, "key13": True, "nope": False}


def _check_consistent(directory, keys, seeds, budget):
    """Every entry present decodes to exactly what was written; budget held; no orphan files."""
    tier = DiskTier(directory, None)
    usage = tier.usage()
    files = list(directory.rglob("*.val"))
    tier.close()
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory, disk_bytes=budget,
                                      kv_format="model"))
    present = {k: store.get(k) for k in keys}
    assert store.stats().tier("disk").corrupt == 0
    assert all(
        kv is None or same_bits(kv, make_kv(s, **KV)) for kv, s in zip(present.values(), seeds)
    )
    assert usage.used_bytes <= budget
    assert len(files) == usage.entries  # no file without a row (and rows were all readable)
    return sum(kv is not None for kv in present.values())


def test_two_processes_writing_the_same_entries_leave_a_consistent_store(tmp_path):
    directory = tmp_path / "kv"
    keys, seeds = [f"key{i}" for i in range(12)], list(range(100, 112))
    budget = 12 * entry_bytes(**KV) + (64 << 10)  # everything fits
    args = {"dir": str(directory), "budget": budget, "kv": KV, "rounds": 2}
    a = procs.start("write", {**args, "keys": keys, "seeds": seeds})
    b = procs.start("write", {**args, "keys": keys[::-1], "seeds": seeds[::-1]})
    for out in (procs.finish(a), procs.finish(b)):
        assert out == {"bad_reads": 0, "errors": 0, "corrupt": 0, "available": True,
                       "over_budget": False}
    assert _check_consistent(directory, keys, seeds, budget) == 12


def test_concurrent_writers_under_a_tight_budget_never_exceed_it(tmp_path):
    directory = tmp_path / "kv"
    keys, seeds = [f"key{i}" for i in range(12)], list(range(200, 212))
    budget = 5 * entry_bytes(**KV) + (48 << 10)  # room for about five
    args = {"dir": str(directory), "budget": budget, "kv": KV}
    a = procs.start("write", {**args, "keys": keys, "seeds": seeds})
    b = procs.start("write", {**args, "keys": keys[::-1], "seeds": seeds[::-1]})
    for out in (procs.finish(a), procs.finish(b)):
        assert out == {"bad_reads": 0, "errors": 0, "corrupt": 0, "available": True,
                       "over_budget": False}
    assert 1 <= _check_consistent(directory, keys, seeds, budget) <= 5
