"""What a test needs to see of a process and a disk tier's folder: open descriptors, entry
files and their bytes, read-only trees."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path


def open_fds() -> int:
    """Descriptors this process has open now (Linux: /proc/self/fd)."""
    return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds


def entry_files(directory: Path) -> list[Path]:
    """The disk tier's entry files under ``directory``."""
    return sorted(directory.rglob("*.val"))


def entry_digests(directory: Path) -> dict[str, str]:
    """sha256 of every entry file, by its path relative to ``directory``."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in entry_files(directory)}


def index_rows(directory: Path) -> dict[str, str]:
    """key -> filename of every row of the disk tier's index, read without changing it."""
    con = sqlite3.connect(f"file:{directory / 'cache.db'}?mode=ro", uri=True)
    try:
        return {str(k): str(f) for k, f in con.execute("SELECT key, filename FROM Cache")}
    finally:
        con.close()


def bytes_on_disk(directory: Path) -> int:
    """Every byte under ``directory`` but the SQLite WAL and shared-memory files (which the
    budget does not count, docs/store.md)."""
    return sum(p.stat().st_size for p in directory.rglob("*")
               if p.is_file() and not p.name.endswith(("-wal", "-shm")))


def chmod_tree(root: Path, writable: bool) -> None:
    """Remove (or give back to the owner) write permission on ``root`` and all below it."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)
