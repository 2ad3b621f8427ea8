"""`blendrag calibrate --namespace --store-keys` keeps the record in that namespace, signed,
where an engine on that namespace's store reads it and no other namespace does; a ratio of 0
is refused before any model work."""

from __future__ import annotations

import json

import pytest

from blendrag.cli import main
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.auth import StoreKeys
from blendrag.store.calibration import CalibrationBook
from blendrag.store.names import Names
from helpers.tiny import PASSAGES

pytestmark = pytest.mark.usefixtures("one_thread")
CORPUS = [p + f"Entry {i}." for i in range(3) for p in PASSAGES]


def _args(model, store, corpus, *extra: str) -> list[str]:
    return ["calibrate", "--model", str(model), "--device", "cpu", "--store-dir", str(store),
            "--corpus", str(corpus), "--prompts", "2", "--per-prompt", "2", "--ratios", "0.3,1",
            "--answer-tokens", "4", "--no-progress", "--answer-kl", "-1", "--same-answer",
            "0", *extra]


def _corpus(tmp_path):
    f = tmp_path / "corpus.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    return f


def test_calibrate_keeps_a_signed_record_in_its_namespace(model_dir, tmp_path, capsys):
    keys_file = tmp_path / "keys"
    keys_file.write_text("k1=" + b"deployment-secret-0123456789".hex())
    keys = StoreKeys.from_file(keys_file)
    store = tmp_path / "kv"
    assert main(_args(model_dir("llama"), store, _corpus(tmp_path), "--namespace", "acme",
                      "--store-keys", str(keys_file))) == 0
    assert "recorded in" in capsys.readouterr().out
    files = list((store / "calibrations").rglob("*.json"))
    assert [f.parent.name for f in files] == [Names("acme", keys).ns_id]
    assert json.loads(files[0].read_text())["auth"].startswith("k1:")

    def latest(namespace: str):
        config = StoreConfig(ram_bytes=0, disk_dir=store, namespace=namespace, auth_key=keys)
        with TieredKVStore(config) as kv:
            found = CalibrationBook.of_store(kv).records()
        return [r.ratio for r in found]

    assert latest("acme") == [0.3] and latest("globex") == [] and latest("") == []


def test_a_ratio_of_zero_is_refused_before_any_model_work(tmp_path, capsys):
    argv = _args(tmp_path / "no-model", tmp_path / "kv", _corpus(tmp_path))
    argv[argv.index("0.3,1")] = "0,0.3"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ratios must be fractions in (0, 1]" in err[0]


def test_a_namespaces_progress_is_kept_in_its_own_folder_signed_with_its_keys(tmp_path):
    from types import SimpleNamespace

    from blendrag.calibration.saved import SavedProgress
    from blendrag.cli.calibration_io import saving

    keys = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
    config = StoreConfig(ram_bytes=0, disk_dir=tmp_path, namespace="acme", auth_key=keys)
    with TieredKVStore(config) as kv:
        saved: list = []
        progress = saving(SavedProgress, SimpleNamespace(store=kv), saved)({"model": "m"})
    assert saved == [progress] and progress.keys is keys
    assert progress.path.parent == tmp_path / "calibration-progress" / Names("acme", keys).ns_id
