"""The disk tier's files whatever happened to its index: an index removed under a running store
is noticed and the store opens the folder again, entry files no index row references (a writer
killed mid-write, a lost index) are removed on the next open, and the folder stays within its
budget."""

from __future__ import annotations

import pytest

from blendrag.store import DiskTier, TieredKVStore
from helpers import procs
from helpers.files import bytes_on_disk, entry_files, index_rows, open_fds
from helpers.kvgen import entry_bytes, exact_config, make_kv, same_bits

KV = dict(layers=2, heads=2, tokens=64, dim=32)  # ~66 KiB an entry
BUDGET = 20 * entry_bytes(**KV) + (64 << 10)  # about twenty entries


def _store(directory) -> TieredKVStore:
    return TieredKVStore(exact_config(ram_bytes=0, disk_dir=directory, disk_bytes=BUDGET))


def _remove_index(directory) -> None:
    for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
        (directory / name).unlink(missing_ok=True)


def test_an_index_removed_under_a_running_store_is_noticed(tmp_path):
    directory = tmp_path / "kv"
    store = _store(directory)
    for i in range(15):
        store.put(f"old{i}", make_kv(i, **KV))
    fds = open_fds()
    _remove_index(directory)
    for i in range(15):  # enough to overflow the budget if the old files stayed
        store.put(f"new{i}", make_kv(100 + i, **KV))
    assert store.get("old0") is None  # gone with its index: a miss, never other bytes
    assert open_fds() == fds  # the old index's descriptors were closed
    other = _store(directory)  # another process's view: what this one wrote after the loss
    assert all(same_bits(other.get(f"new{i}"), make_kv(100 + i, **KV)) for i in range(15))
    rows = index_rows(directory)
    assert len(entry_files(directory)) == len(rows)  # no file without a row
    assert bytes_on_disk(directory) <= BUDGET
    store.close()
    other.close()


def test_a_second_store_made_after_the_loss_and_the_first_agree(tmp_path):
    directory = tmp_path / "kv"
    first = _store(directory)
    first.put("a0", make_kv(1, **KV))
    _remove_index(directory)
    second = _store(directory)  # creates a new index and removes the files it does not know
    second.put("b", make_kv(2, **KV))
    first.put("a1", make_kv(3, **KV))  # noticed here: the first store opens the new index
    first.close()  # closing the old connection must not remove the new index's WAL
    third = _store(directory)
    assert same_bits(third.get("b"), make_kv(2, **KV))
    assert same_bits(third.get("a1"), make_kv(3, **KV))
    assert third.get("a0") is None
    assert len(entry_files(directory)) == len(index_rows(directory)) == 2
    second.close()
    third.close()


def test_unreferenced_files_are_removed_on_open_and_the_budget_kept(tmp_path):
    directory = tmp_path / "kv"
    with _store(directory) as store:
        for i in range(18):
            store.put(f"k{i}", make_kv(i, **KV))
    kept = entry_files(directory)
    stray = directory / "ab" / "cd" / "0123456789abcdef.val"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"x" * (4 * entry_bytes(**KV)))  # an orphan: no row names it
    assert bytes_on_disk(directory) > BUDGET
    tier = DiskTier(directory, BUDGET)
    tier.open()  # any open tidies the folder
    tier.close()
    assert not stray.exists() and entry_files(directory) == kept
    assert bytes_on_disk(directory) <= BUDGET


def test_a_smaller_budget_is_enforced_when_the_folder_is_opened(tmp_path):
    directory = tmp_path / "kv"
    with _store(directory) as store:
        for i in range(18):
            store.put(f"k{i}", make_kv(i, **KV))
    small = BUDGET // 2
    tier = DiskTier(directory, small)
    assert tier.usage().used_bytes <= small
    assert bytes_on_disk(directory) <= small
    assert len(entry_files(directory)) == len(index_rows(directory)) < 18
    tier.close()


@pytest.mark.processes
def test_an_entry_file_left_by_a_writer_killed_mid_write_is_removed_on_the_next_open(tmp_path):
    directory = tmp_path / "kv"
    keys, seeds = [f"key{i}" for i in range(4)], [11, 12, 13, 14]
    proc = procs.start("hang_in_write", {"dir": str(directory), "budget": BUDGET, "keys": keys,
                                         "seeds": seeds, "kv": KV})
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.kill()  # SIGKILL: between writing the entry file and committing its row
        proc.communicate(timeout=60)
    assert len(entry_files(directory)) == len(index_rows(directory)) + 1  # the orphan
    fds = open_fds()
    with _store(directory) as store:
        assert store.get("last") is None
        assert all(same_bits(store.get(k), make_kv(s, **KV)) for k, s in zip(keys, seeds))
        assert len(entry_files(directory)) == len(index_rows(directory)) == len(keys)
        assert bytes_on_disk(directory) <= BUDGET
    assert open_fds() == fds


def test_a_file_of_the_users_in_the_folder_is_never_taken_for_an_orphan(tmp_path):
    directory = tmp_path / "kv"
    with TieredKVStore(exact_config(ram_bytes=0, disk_dir=directory, disk_bytes=BUDGET)) as s:
        s.put("a", make_kv(1, **KV))
    mine = [directory / "notes" / "ab" / "keep.val", directory / "ab" / "cd" / "My Notes.val"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's own file")
    with TieredKVStore(exact_config(ram_bytes=0, disk_dir=directory, disk_bytes=BUDGET)) as s:
        assert same_bits(s.get("a"), make_kv(1, **KV))
    assert all(p.read_text() == "the user's own file" for p in mine)
