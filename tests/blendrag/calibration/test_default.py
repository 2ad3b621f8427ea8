"""The default ``BlendConfig()`` runs the calibration its engine's store keeps for its model
(``engine/selection/calibrated.py``); an explicit config runs as given; without a calibration the
built-in default runs, said once."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from blendrag import BlendConfig, BlendEngine
from blendrag.integration.settings import BlendSettings, fields_from_configs
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def record(engine: BlendEngine, selector: str = "epic", ratio: float | None = 0.5,
           model: str | None = None) -> CalibrationRecord:
    return CalibrationRecord(model or engine.model_fp, engine.tokenizer_fp, "c" * 64, selector,
                             ratio, {"same_answer": 0.9, "answer_kl": 0.02,
                                     "answer_tokens": 32, "first_sentence": False},
                             (FrontierPoint(selector, ratio or 1.0, 0.95, 0.004, 2.0),),
                             "flow words", 24, 10.0)


@pytest.fixture
def on_store(model_dir, tmp_path):
    """factory() -> an engine over a disk store at tmp_path/kv (a new one each call), the
    passages ingested: a request runs the mode the calibration resolves to, not the full
    prefill of a first question over passages in no store."""
    stores = []

    def make() -> BlendEngine:
        store = TieredKVStore(StoreConfig(disk_dir=tmp_path / "kv"))
        stores.append(store)
        engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                             store=store)
        engine.ingest(PASSAGES, prefix=PREFIX)
        return engine

    yield make
    for s in stores:
        s.close()


def test_the_default_config_runs_the_stores_calibration(on_store):
    engine = on_store()
    CalibrationBook.beside(engine.store.disk_dir).put(record(engine))
    engine = on_store()  # a new process would find it the same way
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    stats = engine.prefill(layout, BlendConfig()).stats
    assert (stats.mode, stats.selector, stats.ratio) == ("blend", "epic", 0.5)
    assert stats.calibration.same_answer == 0.95 and stats.calibration.ratio == 0.5
    assert stats.to_dict()["calibration"] == dataclasses.asdict(stats.calibration)
    same = engine.prefill(layout, BlendConfig(selector="epic", ratio=0.5)).logits
    assert (engine.prefill(layout, BlendConfig(mode="blend")).logits == same).all()
    # an explicit config runs as given, even the built-in default's values
    explicit = engine.prefill(layout, BlendConfig(selector="preview", ratio=0.2)).stats
    assert (explicit.selector, explicit.ratio, explicit.calibration) == ("preview", 0.2, None)
    assert engine.prefill(layout, BlendConfig(mode="reuse")).stats.calibration is None


def test_a_calibration_where_no_ratio_met_the_target_runs_a_full_prefill(on_store):
    engine = on_store()
    engine.use_calibration(record(engine, ratio=None))
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    pre = engine.prefill(layout, BlendConfig())
    assert pre.stats.mode == "full" and pre.stats.calibration.ratio is None
    assert (pre.logits == engine.prefill(layout, BlendConfig(mode="full")).logits).all()


def test_another_models_calibration_is_never_used(on_store, caplog):
    engine = on_store()
    CalibrationBook.beside(engine.store.disk_dir).put(record(engine, model="f" * 64))
    engine = on_store()
    assert engine.calibration is None
    with pytest.raises(ValueError, match="another model"):
        engine.use_calibration(record(engine, model="f" * 64))
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with caplog.at_level(logging.WARNING, logger="blendrag.engine.selection.calibrated"):
        for _ in range(2):
            stats = engine.prefill(layout, BlendConfig()).stats
            assert (stats.selector, stats.ratio, stats.calibration) == ("preview", 0.2, None)
    said = [r.message for r in caplog.records if "no calibration" in r.message]
    assert len(said) == 1 and "blendrag calibrate" in said[0]


def test_a_calibration_stops_running_once_the_weights_change(on_store):
    """A calibration holds for the weights it was measured on: changed in place (a fine-tune
    loaded into the same model), the default no longer runs the old record's ratio."""
    import torch

    engine = on_store()
    CalibrationBook.beside(engine.store.disk_dir).put(record(engine))
    engine = on_store()
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    assert engine.prefill(layout, BlendConfig()).stats.ratio == 0.5
    with torch.no_grad():
        next(engine.model.parameters()).add_(0.01)
    stats = engine.prefill(layout, BlendConfig()).stats  # (its chunks' keys changed too)
    assert stats.calibration is None and stats.ratio != 0.5
    assert engine.calibration is None


def test_framework_settings_leave_the_ratio_to_the_calibration():
    assert BlendSettings().blend_config().calibrated
    assert not BlendSettings(ratio=0.2).blend_config().calibrated
    assert not BlendSettings(selector="preview").blend_config().calibrated
    assert BlendSettings().blend_config() == BlendConfig()
    assert fields_from_configs(BlendConfig())["ratio"] is None
    assert fields_from_configs(BlendConfig(ratio=0.3))["ratio"] == 0.3
