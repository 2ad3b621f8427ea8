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


@pytest.mark.parametrize("command", ["stats", "clear"])
def test_a_store_dir_that_is_a_file_is_an_error_naming_it(tmp_path, capsys, command):
    not_a_folder = tmp_path / "kv"
    not_a_folder.write_text("a regular file")
    assert _run(["cache", command, "--store-dir", str(not_a_folder)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"blendrag cache {command}: error: NotADirectoryError: --store-dir "
                          f"{not_a_folder} is not a folder")
    assert not_a_folder.read_text() == "a regular file"


def test_stats_says_a_passage_has_two_chunk_entries_with_the_default_context(tmp_path, capsys):
    _fill(tmp_path / "kv", 2)
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
    text = capsys.readouterr().out
    assert "one per ingested passage" not in text
    assert ("per ingested passage, its rows computed after the chunk prefix and the ingestion "
            "context's filler passages, and (with the default context) its exact rows after "
            "the chunk prefix alone") in text


def test_stats_counts_unreferenced_files_and_removes_nothing(tmp_path, capsys):
    _fill(tmp_path / "kv", 2)
    stray = tmp_path / "kv" / "ab" / "cd" / "0123456789abcdef.val"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"x" * 5000)
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--json"]) == 0
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert (disk["entries"], disk["unreferenced"]) == (2, {"files": 1, "bytes": 5000})
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
    assert ("1 entry file (4.9 KiB) that no index row references: removed when the store next "
            "opens this folder") in capsys.readouterr().out
    assert stray.exists()
    assert _run(["cache", "clear", "--store-dir", str(tmp_path / "kv")]) == 0
    assert not stray.exists()


def test_s3_and_redis_cluster_stats_and_clear(tmp_path, s3, redis_cluster, redis_prefix, capsys):
    url = f"s3://{s3.bucket}/{redis_prefix.strip(':')}"
    cfg = StoreConfig(ram_bytes=0, disk_dir=None, redis_url=redis_cluster.url,
                      redis_prefix=redis_prefix, s3_url=url, s3_endpoint_url=s3.endpoint)
    with TieredKVStore(cfg) as store:
        for i in range(6):  # on a cluster, spread over its nodes
            store.put(f"k{i}", make_kv(i))
    loc = ["--store-dir", str(tmp_path / "kv"), "--redis-url", redis_cluster.url,
           "--redis-prefix", redis_prefix, "--s3-url", url, "--s3-endpoint", s3.endpoint]
    _run(["cache", "stats", *loc, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["redis"]["entries"] == report["s3"]["entries"] == 6
    _run(["cache", "clear", *loc])
    out = capsys.readouterr().out
    assert f"removed 6 entries (objects {url}/*) from S3" in out
    assert f"removed 6 entries (keys {redis_prefix}*)" in out
    _run(["cache", "stats", *loc, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["redis"]["entries"] == report["s3"]["entries"] == 0


def test_a_bad_s3_url_is_an_error_naming_it(tmp_path, capsys):
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--s3-url",
                 "s3://bucket-without-prefix"]) == 2
    assert "s3://bucket/prefix" in capsys.readouterr().err
