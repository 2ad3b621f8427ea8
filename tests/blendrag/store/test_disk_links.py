"""Writes to the disk tier never follow a symlink out of the store: an entry folder (either level)
or the entry's own name replaced by a symlink refuses the write with a logged error, nothing is
created outside the store, and no valid entry is evicted for the refused write or removed
through a link."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from blendrag.store import DiskTier, disk_files

NAME = "abcd" + "0" * 28  # the random hex name the next entry file gets (pinned below)
ENTRY = Path("ab", "cd", "0" * 28 + ".val")
DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def pinned(monkeypatch):
    """The entry file names the tier draws, fixed: a test plants links where the next write
    goes (an attacker would plant them in every folder)."""
    monkeypatch.setattr(disk_files.secrets, "token_hex", lambda n: NAME)


def _tier(root: Path, budget: int = 1 << 20) -> DiskTier:
    tier = DiskTier(root, budget)
    tier.open()
    return tier


def _files(folder: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(folder)) for d, _, files in os.walk(folder)
                  for f in files)


def _refused(caplog) -> bool:
    return any(r.levelno == logging.ERROR and "refused" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("link", ["ab", "ab/cd"], ids=["shard folder", "sub-folder"])
def test_a_symlinked_folder_refuses_the_write(tmp_path, pinned, link, caplog):
    root, outside = tmp_path / "kv", tmp_path / "outside"
    (outside / "cd").mkdir(parents=True)
    tier = _tier(root)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside if link == "ab" else outside / "cd")
    with caplog.at_level(logging.ERROR, logger="blendrag.store"):
        assert tier.put("k", DATA) is False  # refused: a miss later, never a failed request
    assert _refused(caplog)
    assert _files(outside) == [] and not tier.contains("k")
    assert (root / link).is_symlink()  # left for the operator to see
    tier.close()


def test_a_symlink_at_the_entrys_own_name_is_not_written_through(tmp_path, pinned, caplog):
    root, outside = tmp_path / "kv", tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim"
    target.write_bytes(b"not yours")
    tier = _tier(root)
    (root / ENTRY).parent.mkdir(parents=True)
    (root / ENTRY).symlink_to(target)
    with caplog.at_level(logging.ERROR, logger="blendrag.store"):
        assert tier.put("k", DATA) is False
    assert _refused(caplog) and target.read_bytes() == b"not yours"
    assert _files(outside) == ["victim"]
    tier.close()


def test_a_refused_write_evicts_no_valid_entry(tmp_path, monkeypatch, caplog):
    root, outside = tmp_path / "kv", tmp_path / "outside"
    outside.mkdir()
    tier = _tier(root, budget=8 * len(DATA))
    stored = [f"k{i}" for i in range(5)]
    for key in stored:  # random names: real entries
        assert tier.put(key, DATA)
    before = tier.usage().entries
    monkeypatch.setattr(disk_files.secrets, "token_hex", lambda n: NAME)
    (root / "ab").mkdir(exist_ok=True)
    (root / "ab" / "cd").symlink_to(outside)
    big = DATA * 4  # would evict LRU entries to fit, were it written
    with caplog.at_level(logging.ERROR, logger="blendrag.store"):
        assert tier.put("big", big) is False
    assert tier.usage().entries == before
    assert all(tier.fetch(key).read() == DATA for key in stored)  # type: ignore[union-attr]
    assert _files(outside) == []
    tier.close()


def test_an_entry_is_never_removed_through_a_link(tmp_path, pinned):
    root, outside = tmp_path / "kv", tmp_path / "outside"
    outside.mkdir()
    tier = _tier(root)
    assert tier.put("k", DATA) and (root / ENTRY).is_file()
    # its folder swapped for a link to a folder that holds a file of the same name
    (root / ENTRY).rename(tmp_path / "moved.val")
    (root / ENTRY).parent.rmdir()
    (root / ENTRY).parent.symlink_to(outside)
    (outside / ENTRY.name).write_bytes(b"keep me")
    tier.delete("k")
    assert (outside / ENTRY.name).read_bytes() == b"keep me" and not tier.contains("k")
    tier.close()


def test_entries_are_written_and_removed_as_before(tmp_path):
    tier = _tier(tmp_path / "kv", budget=4 * len(DATA))
    for i in range(6):  # past the budget: the oldest evicted, their files and folders removed
        assert tier.put(f"k{i}", DATA)
    files = [f for f in _files(tmp_path / "kv") if f.endswith(".val")]
    assert len(files) == tier.usage().entries < 6
    assert tier.fetch("k5").read() == DATA  # type: ignore[union-attr]
    tier.clear()
    assert [f for f in _files(tmp_path / "kv") if f.endswith(".val")] == []
    assert [p.name for p in (tmp_path / "kv").iterdir() if p.is_dir()] == []
    tier.close()


def test_a_write_that_fails_midway_leaves_no_partial_file(tmp_path, pinned):
    tier = _tier(tmp_path / "kv")
    disk = tier.open().disk

    def full_disk():
        yield b"partial"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"), disk.writing():
        disk._write(str(tmp_path / "kv" / ENTRY), full_disk(), "xb")
    assert [f for f in _files(tmp_path / "kv") if f.endswith(".val")] == []
    tier.close()
