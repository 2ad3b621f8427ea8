"""Descriptors: running out of them is a failure of the tier, never a damaged entry, and a disk
tier that fails to open leaves none behind. Each case runs in a child process
(``helpers.store_worker``): a lowered RLIMIT_NOFILE, or a process that obeys permission bits."""

from __future__ import annotations

import os

import pytest

from blendrag.store import StoreConfig, TieredKVStore
from helpers import procs
from helpers.files import chmod_tree, entry_digests, index_rows
from helpers.kvgen import make_kv

pytestmark = pytest.mark.processes

KV = dict(layers=2, heads=2, tokens=16, dim=16)


def _fill(directory, n: int) -> tuple[list[str], list[int]]:
    keys, seeds = [f"key{i}" for i in range(n)], list(range(300, 300 + n))
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory, disk_bytes=64 << 20)) as s:
        for key, seed in zip(keys, seeds):
            s.put(key, make_kv(seed, **KV))
    return keys, seeds


def test_running_out_of_descriptors_deletes_no_entry(tmp_path):
    directory = tmp_path / "kv"
    keys, seeds = _fill(directory, 100)
    files, rows = entry_digests(directory), index_rows(directory)
    out = procs.run("exhaust_descriptors", {"dir": str(directory), "budget": 64 << 20,
                                            "keys": keys, "seeds": seeds, "kv": KV, "spare": 24})
    assert out["wrong"] == 0  # whatever came back is the right entry
    assert 0 < out["layered_opened"] < len(keys)  # the limit was reached
    for name in ("layered", "whole"):
        # "too many open files" is a failure of the tier (benched after three), not damage
        assert out[name] == {"corrupt": 0, "errors": 3, "available": False}, out
    assert out["fds_after"] == out["fds_before"]
    assert out["seconds"] < 30
    assert entry_digests(directory) == files and index_rows(directory) == rows  # nothing deleted


def test_a_failed_open_leaves_no_descriptor(tmp_path):
    if os.geteuid() == 0 and not procs.can_drop_dac_override():
        pytest.skip("running as root without CAP_SETPCAP: cannot make a folder read-only to "
                    "this process")
    directory = tmp_path / "kv"
    _fill(directory, 1)
    chmod_tree(directory, writable=False)
    try:
        out = procs.run("failed_opens", {"dir": str(directory), "n": 50},
                        drop_dac_override=os.geteuid() == 0)
    finally:
        chmod_tree(directory, writable=True)
    assert out["disk_errors"] > 0  # the folder really could not be opened
    assert out["after"] == out["before"]  # without waiting for the garbage collector
    assert out["after_gc"] == out["before"]
