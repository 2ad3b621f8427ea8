"""`blendrag cache stats` / `blendrag cache clear`."""

from __future__ import annotations

import argparse
import json

import pytest

from blendrag.cli import cache as store_cli
from blendrag.store import StoreConfig, TieredKVStore
from helpers.kvgen import make_kv


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="blendrag")
    store_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _fill(directory, n: int) -> None:
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory, disk_bytes=3 << 20)) as store:
        for i in range(n):
            store.put(f"k{i}", make_kv(i))
        store.get("k0")
        store.get("absent")


def test_stats_reports_entries_budget_and_lifetime_counts(tmp_path, capsys):
    _fill(tmp_path / "kv", 3)
    assert _run(["cache", "stats", "--dir", str(tmp_path / "kv"), "--json"]) == 0
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert (disk["entries"], disk["budget_bytes"], disk["lifetime_hits"],
            disk["lifetime_misses"]) == (3, 3 << 20, 1, 1)
    assert 0 < disk["used_bytes"] <= 3 << 20
    assert _run(["cache", "stats", "--dir", str(tmp_path / "kv")]) == 0
    assert "entries: 3" in capsys.readouterr().out


def test_stats_on_a_missing_directory_does_not_create_it(tmp_path, capsys):
    assert _run(["cache", "stats", "--dir", str(tmp_path / "none"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disk"]["exists"] is False
    assert not (tmp_path / "none").exists()


def test_clear_empties_the_disk_tier_and_keeps_the_budget(tmp_path, capsys):
    _fill(tmp_path / "kv", 2)
    assert _run(["cache", "clear", "--dir", str(tmp_path / "kv")]) == 0
    assert "cleared" in capsys.readouterr().out
    _run(["cache", "stats", "--dir", str(tmp_path / "kv"), "--json"])
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert (disk["entries"], disk["budget_bytes"]) == (0, 3 << 20)
    assert list((tmp_path / "kv").rglob("*.val")) == []


def test_redis_stats_and_clear(tmp_path, redis_server, redis_prefix, capsys):
    cfg = StoreConfig(ram_bytes=0, disk_dir=None, redis_url=redis_server.url,
                      redis_prefix=redis_prefix)
    with TieredKVStore(cfg) as store:
        store.put("a", make_kv(1))
        store.put("b", make_kv(2))
    loc = ["--dir", str(tmp_path / "kv"), "--redis-url", redis_server.url, "--redis-prefix",
           redis_prefix]
    _run(["cache", "stats", *loc, "--json"])
    assert json.loads(capsys.readouterr().out)["redis"]["entries"] == 2
    _run(["cache", "clear", *loc])
    assert f"cleared keys {redis_prefix}*" in capsys.readouterr().out
    _run(["cache", "stats", *loc, "--json"])
    assert json.loads(capsys.readouterr().out)["redis"]["entries"] == 0


def test_cache_needs_a_subcommand():
    with pytest.raises(SystemExit):
        _run(["cache"])
