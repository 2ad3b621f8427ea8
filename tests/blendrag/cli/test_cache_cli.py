"""`blendrag cache stats` / `blendrag cache clear`."""

from __future__ import annotations

import argparse
import json

import pytest

from blendrag.cli import cache as store_cli
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import StoreConfig, TieredKVStore
from helpers.kvgen import make_kv


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="blendrag")
    store_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _fill(directory, n: int, prefixes: int = 0) -> None:
    """n chunk entries (8 tokens each) and ``prefixes`` entries computed after nothing (the
    prefix and prefix + filler KVs, 8 tokens each)."""
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory, disk_bytes=3 << 20)) as store:
        for i in range(n):
            store.put(f"k{i}", make_kv(i))
        for i in range(prefixes):
            kv = make_kv(100 + i)
            store.put(f"p{i}", ChunkKV(kv.keys, kv.values, kv.token_ids, prefix_hash=""))
        store.get("k0")
        store.get("absent")


def test_stats_reports_entries_budget_and_lifetime_counts(tmp_path, capsys):
    _fill(tmp_path / "kv", 3, prefixes=2)
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--json"]) == 0
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert (disk["entries"], disk["budget_bytes"], disk["lifetime_hits"],
            disk["lifetime_misses"]) == (5, 3 << 20, 1, 1)
    assert 0 < disk["used_bytes"] <= 3 << 20
    assert (disk["chunks"]["entries"], disk["chunks"]["tokens"]) == (3, 24)
    assert (disk["prefixes"]["entries"], disk["prefixes"]["tokens"]) == (2, 16)
    assert disk["other"]["entries"] == 0
    assert disk["chunks"]["bytes"] + disk["prefixes"]["bytes"] < disk["used_bytes"]  # + index
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
    text = capsys.readouterr().out
    assert "  5 entries, " in text and " of a 3.0 MiB budget" in text
    assert "chunks        3 entries        24 tokens" in text
    assert "prefixes      2 entries        16 tokens" in text
    assert "1 found, 1 not found" in text


def test_human_bytes():
    assert [store_cli.human_bytes(n) for n in (0, 1023, 4096, 52_900_000, 64 << 30, 3 << 40)] == \
        ["0 B", "1023 B", "4.0 KiB", "50.4 MiB", "64.0 GiB", "3072.0 GiB"]


def test_stats_on_a_missing_directory_does_not_create_it(tmp_path, capsys):
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "none"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disk"]["exists"] is False
    assert not (tmp_path / "none").exists()


def test_clear_empties_the_disk_tier_and_keeps_the_budget(tmp_path, capsys):
    _fill(tmp_path / "kv", 2)
    assert _run(["cache", "clear", "--store-dir", str(tmp_path / "kv")]) == 0
    assert capsys.readouterr().out.startswith("removed 2 entries (")
    assert _run(["cache", "clear", "--store-dir", str(tmp_path / "none")]) == 0
    assert "nothing to remove: no KV store at" in capsys.readouterr().out
    _run(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--json"])
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert (disk["entries"], disk["budget_bytes"]) == (0, 3 << 20)
    assert list((tmp_path / "kv").rglob("*.val")) == []


def test_redis_stats_and_clear(tmp_path, redis_server, redis_prefix, capsys):
    cfg = StoreConfig(ram_bytes=0, disk_dir=None, redis_url=redis_server.url,
                      redis_prefix=redis_prefix)
    with TieredKVStore(cfg) as store:
        store.put("a", make_kv(1))
        store.put("b", make_kv(2))
    loc = ["--store-dir", str(tmp_path / "kv"), "--redis-url", redis_server.url, "--redis-prefix",
           redis_prefix]
    _run(["cache", "stats", *loc, "--json"])
    assert json.loads(capsys.readouterr().out)["redis"]["entries"] == 2
    _run(["cache", "clear", *loc])
    assert f"removed 2 entries (keys {redis_prefix}*)" in capsys.readouterr().out
    _run(["cache", "stats", *loc, "--json"])
    assert json.loads(capsys.readouterr().out)["redis"]["entries"] == 0


def test_cache_needs_a_subcommand():
    with pytest.raises(SystemExit):
        _run(["cache"])
