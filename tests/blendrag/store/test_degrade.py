"""A disk that cannot be written (absent, read-only, full) degrades the store to its other tiers."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import pytest

from blendrag.store import StoreConfig, TieredKVStore, disk_files
from helpers import procs
from helpers.kvgen import make_kv, same_bits


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "blendrag.store"
    ]


def test_uncreatable_directory_degrades_to_ram_with_a_warning(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        store = TieredKVStore(StoreConfig(ram_bytes=1 << 20, disk_dir=blocker / "kv"))
    assert any("disk tier" in m and "failed to open" in m for m in _warnings(caplog))
    kv = make_kv(1)
    store.put("k", kv)
    assert same_bits(store.get("k"), kv) and store.contains("k")
    assert store.stats().tier("disk").available is False


def test_full_disk_degrades_with_one_warning_leaves_no_partial_file_and_recovers(
    make_store, tmp_path, caplog, monkeypatch
):
    store = make_store(retry_after_s=3600)
    store.put("before", make_kv(0))
    real_write = disk_files._write_new

    def enospc(folder, name, iterator):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(b"partial")  # what a full disk leaves behind
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_files, "_write_new", enospc)
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        for i in range(1, 4):
            store.put(f"k{i}", make_kv(i))
    assert len(_warnings(caplog)) == 1 and "No space left" in _warnings(caplog)[0]
    assert all(same_bits(store.get(f"k{i}"), make_kv(i)) for i in range(1, 4))  # served from RAM
    s = store.stats().tier("disk")
    assert (s.available, s.errors) == (False, 1)
    files = list((tmp_path / "kv").rglob("*.val"))
    assert len(files) == 1  # only "before"; the partial file was removed

    # Space is back and the bench has expired: the disk is used again.
    monkeypatch.setattr(disk_files, "_write_new", real_write)
    store.config.retry_after_s = 0
    for slot in store.tiers:
        slot.health.retry_after_s = 0
        slot.health.retry_now()
    store.put("after", make_kv(5))
    assert make_store(ram_bytes=0).contains("after")


def _populate(directory: Path) -> None:
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory, disk_bytes=4 << 20))
    store.put("old", make_kv(8))
    store.close()


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)


def test_read_only_directory_degrades_to_ram_with_a_warning(tmp_path, caplog):
    if os.geteuid() != 0:
        directory = tmp_path / "kv"
        _populate(directory)
        _chmod_tree(directory, writable=False)
        try:
            with caplog.at_level(logging.WARNING, logger="blendrag.store"):
                store = TieredKVStore(StoreConfig(ram_bytes=1 << 20, disk_dir=directory))
                kv = make_kv(9)
                store.put("new", kv)
                out = {"warnings": _warnings(caplog), "served": same_bits(store.get("new"), kv),
                       "disk_available": store.stats().tier("disk").available}
        finally:
            _chmod_tree(directory, writable=True)
    else:
        # Root ignores permission bits (CAP_DAC_OVERRIDE): the store runs in a child process
        # whose capability bounding set lacks it, so the read-only bits bind it as they bind users.
        if not procs.can_drop_dac_override():
            pytest.skip("running as root without CAP_SETPCAP: cannot make a directory read-only to "
                        "this process")
        directory = tmp_path / "kv"
        _populate(directory)
        _chmod_tree(directory, writable=False)
        try:
            out = procs.run("readonly", {"dir": str(directory)}, drop_dac_override=True)
        finally:
            _chmod_tree(directory, writable=True)
    assert out["served"] is True and out["disk_available"] is False
    assert any("disk tier" in m and "failed" in m for m in out["warnings"]), out["warnings"]
