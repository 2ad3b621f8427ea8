"""The suite runs in a temporary home of its own (set by tests/conftest.py): a default store,
the model cache and a child process all resolve ``~`` there, and nothing reaches the user's
``~/.cache/blendrag``, where ``make demo`` keeps the user's KVs."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from blendrag.model.catalog import DEFAULT_CACHE_DIR
from blendrag.store import StoreConfig, TieredKVStore
from helpers import procs
from helpers.kvgen import make_kv, same_bits

REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)  # the account's home, whatever HOME says


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    """Every file under ``folder`` with its size and modification time (empty if none)."""
    if not folder.exists():
        return []
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in folder.rglob("*"))


def test_home_and_blendrag_folders_are_the_temporary_home(test_home):
    assert test_home != REAL_HOME and not test_home.is_relative_to(REAL_HOME)
    assert Path.home() == test_home
    assert Path("~/.cache/blendrag").expanduser() == test_home / ".cache" / "blendrag"
    assert os.environ["XDG_CACHE_HOME"] == str(test_home / ".cache")
    assert StoreConfig().disk_dir == test_home / ".cache" / "blendrag" / "kv"
    assert DEFAULT_CACHE_DIR == test_home / ".cache" / "blendrag" / "models"


def test_a_child_process_resolves_the_same_home(test_home):
    code = ("from blendrag.store import StoreConfig; from blendrag.model import catalog; "
            "print(StoreConfig().disk_dir); print(catalog.DEFAULT_CACHE_DIR)")
    out = subprocess.run([sys.executable, "-c", code], env=procs._env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert [Path(p) for p in out] == [test_home / ".cache" / "blendrag" / "kv",
                                     test_home / ".cache" / "blendrag" / "models"]


def test_a_default_store_writes_into_the_temporary_home_only(test_home):
    real = REAL_HOME / ".cache" / "blendrag"
    before = _listing(real)
    kv = make_kv(3)
    with TieredKVStore(StoreConfig(ram_bytes=0, kv_format="model")) as store:
        try:
            store.put("home-test", kv)
            assert same_bits(store.get("home-test"), kv)  # read back from the disk tier
            assert _listing(test_home / ".cache" / "blendrag" / "kv")  # written there
        finally:
            store.clear()
    assert _listing(real) == before
