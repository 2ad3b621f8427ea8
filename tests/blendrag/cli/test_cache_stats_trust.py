"""`blendrag cache stats` counts one namespace's entries when asked for one, and reads every
stored byte as untrusted: hostile index rows, entries and calibration records are counted as
unreadable or refused, never a traceback."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3

import pytest

from blendrag.cli import cache as store_cli
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.auth import StoreKeys
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint
from blendrag.store.names import Names
from helpers.kvgen import make_kv

KEYS_TEXT = "k1=" + b"deployment-secret-0123456789".hex()


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="blendrag")
    store_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _stats(capsys, directory, *extra: str) -> dict:
    assert _run(["cache", "stats", "--store-dir", str(directory), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _fill(directory, keys: StoreKeys | None = None) -> None:
    """3 entries of the default namespace, 2 of acme's (4 tokens each), 1 of globex's."""
    for namespace, n, tokens in (("", 3, 8), ("acme", 2, 4), ("globex", 1, 8)):
        config = StoreConfig(ram_bytes=0, disk_dir=directory, namespace=namespace,
                             auth_key=keys, kv_format="model")
        with TieredKVStore(config) as store:
            for i in range(n):
                store.put(f"{namespace}{i}", make_kv(i, tokens=tokens))


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_stats_of_a_namespace_count_its_entries_and_bytes_only(tmp_path, capsys, keyed):
    keys_file = tmp_path / "keys"
    keys_file.write_text(KEYS_TEXT)
    keys = StoreKeys.from_file(keys_file) if keyed else None
    _fill(tmp_path / "kv", keys)
    with_keys = ["--store-keys", str(keys_file)] if keyed else []
    acme = _stats(capsys, tmp_path / "kv", "--namespace", "acme", *with_keys)
    disk = acme["disk"]
    assert (disk["entries"], disk["chunks"]["entries"], disk["chunks"]["tokens"]) == (2, 2, 8)
    assert disk["store_entries"] == 6 and disk["namespace"] == Names("acme", keys).ns_id
    assert disk["used_bytes"] == disk["chunks"]["bytes"] + disk["prefixes"]["bytes"] > 0
    assert disk["used_bytes"] < disk["store_used_bytes"] / 2
    assert acme["namespace"]["disk_entries"] == 2
    whole = _stats(capsys, tmp_path / "kv")["disk"]
    if not keyed:  # no namespace asked: every namespace's entries, each counted
        assert (whole["entries"], whole["chunks"]["entries"]) == (6, 6)
        assert sorted(whole["namespaces"].values()) == [1, 2, 3]
        assert whole["namespaces"][""] == 3 and whole["namespaces"][disk["namespace"]] == 2
        assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
        assert "in every namespace (entries): the default one 3, " in capsys.readouterr().out
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv"), "--namespace", "acme",
                 *with_keys]) == 0
    text = capsys.readouterr().out
    assert f"namespace acme (id {disk['namespace']}): 2 entries, " in text
    assert "(the whole store: 6 entries, " in text
    assert "chunks        2 entries         8 tokens" in text


def _plant_entries(directory) -> int:
    """Index rows and entry files an attacker with write access could leave; how many."""
    con = sqlite3.connect(directory / "cache.db")
    rows = con.execute("SELECT rowid, filename FROM Cache ORDER BY rowid").fetchall()
    first = directory / rows[0][1]
    first.write_bytes(b"\x00" * 64 + os.urandom(200))  # garbage bytes
    second = directory / rows[1][1]
    second.unlink()
    os.mkfifo(second)  # a pipe: reading it would block
    for rowid, filename in ((rows[2][0], "/etc/passwd"), (rows[3][0], "../../outside.val"),
                            (rows[4][0], None)):
        con.execute("UPDATE Cache SET filename = ?, size = 'lots' WHERE rowid = ?",
                    (filename, rowid))
    con.commit()
    con.close()
    return 5


def test_stats_count_hostile_entries_as_unreadable_without_a_traceback(tmp_path, capsys):
    _fill(tmp_path / "kv")
    planted = _plant_entries(tmp_path / "kv")
    disk = _stats(capsys, tmp_path / "kv")["disk"]
    assert disk["other"]["entries"] == planted and disk["other"]["tokens"] == 0
    assert disk["chunks"]["entries"] == 6 - planted
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
    out, err = capsys.readouterr()
    assert f"other         {planted} entries" in out and "Traceback" not in out + err


def _record(ratio: float = 0.5) -> CalibrationRecord:
    return CalibrationRecord("m" * 64, "t" * 64, "c" * 64, "epic", ratio,
                             {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32,
                              "first_sentence": False},
                             (FrontierPoint("epic", 0.2, 0.95, 0.004, 2.0),), "flow", 24, 10.0)


@pytest.mark.parametrize("changes", [{"ratio": "0.5"}, {"ratio": float("nan")}, {"ratio": 0.0},
                                     {"selector": "nope"}, {"created": "yesterday"},
                                     {"created": 1e300}, {"prompts": []}],
                         ids=["text ratio", "NaN ratio", "zero ratio", "unknown selector",
                              "text date", "huge date", "list prompts"])
def test_stats_count_refused_calibration_records_without_a_traceback(tmp_path, capsys,
                                                                     changes):
    _fill(tmp_path / "kv")
    book = CalibrationBook.beside(tmp_path / "kv")
    book.put(_record())  # valid; its chosen ratio is not on its frontier: no shares to show
    path = book.put(CalibrationRecord(**{**_record().__dict__, "model": "x" * 64}))
    outer = json.loads(path.read_text())
    body = {**outer["record"], **changes}
    outer.update(record=body, sha256=hashlib.sha256(
        json.dumps(body, sort_keys=True).encode()).hexdigest())
    path.write_text(json.dumps(outer))
    report = _stats(capsys, tmp_path / "kv")
    assert [c["model"] for c in report["calibrations"]] == ["m" * 12]
    assert [r["file"] for r in report["calibrations_refused"]] == [path.name]
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 0
    out, err = capsys.readouterr()
    assert "the default config runs epic at 0.5\n" in out
    assert f"1 calibration record refused (damaged, forged or invalid; never used): " \
           f"{path.name}: " in out and "Traceback" not in out + err


def test_stats_of_a_namespace_list_its_own_calibrations_verified(tmp_path, capsys):
    keys_file = tmp_path / "keys"
    keys_file.write_text(KEYS_TEXT)
    keys = StoreKeys.from_file(keys_file)
    _fill(tmp_path / "kv", keys)
    CalibrationBook.beside(tmp_path / "kv", Names("acme", keys)).put(_record())
    acme = ["--namespace", "acme", "--store-keys", str(keys_file)]
    report = _stats(capsys, tmp_path / "kv", *acme)
    assert [c["ratio"] for c in report["calibrations"]] == [0.5]
    assert report["calibrations_refused"] == []
    assert _stats(capsys, tmp_path / "kv", "--namespace", "globex", "--store-keys",
                  str(keys_file))["calibrations"] == []
    assert _stats(capsys, tmp_path / "kv")["calibrations"] == []  # not the default's


def test_an_index_that_is_not_one_is_an_error_line(tmp_path, capsys):
    (tmp_path / "kv").mkdir()
    (tmp_path / "kv" / "cache.db").write_bytes(os.urandom(4096))
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("blendrag cache stats: error: ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("setting,value", [("count", "x"), ("size", None), ("hits", "zz"),
                                           ("size_limit", "abc")])
def test_damaged_index_settings_are_an_error_line(tmp_path, capsys, setting, value):
    _fill(tmp_path / "kv")
    con = sqlite3.connect(tmp_path / "kv" / "cache.db")
    con.execute("UPDATE Settings SET value = ? WHERE key = ?", (value, setting))
    con.commit()
    con.close()
    assert _run(["cache", "stats", "--store-dir", str(tmp_path / "kv")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("blendrag cache stats: error: ")
    assert len(err.strip().splitlines()) == 1
