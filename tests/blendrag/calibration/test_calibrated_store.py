"""What the default config runs, read from a store object (``CalibratedDefault(store=...)``):
its namespace's records only, verified with its keys, its public namespace's where its config
opts in; a bad record is the built-in default, never an exception; ``use`` refuses what the
engine cannot run."""

from __future__ import annotations

import pytest

from blendrag.config import BlendConfig
from blendrag.engine.selection.calibrated import CalibratedDefault
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.auth import StoreKeys
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint

KEYS = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
M, T = "m" * 64, "t" * 64


def record(ratio: float | None = 0.5, selector: str = "epic") -> CalibrationRecord:
    return CalibrationRecord(M, T, "c" * 64, selector, ratio,
                             {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32,
                              "first_sentence": False},
                             (FrontierPoint(selector, ratio or 1.0, 0.95, 0.004, 2.0),),
                             "flow", 24, 10.0, created=1000.0)


def calibrated(store) -> CalibratedDefault:
    return CalibratedDefault(lambda: (M, T), store=lambda: store)


@pytest.fixture
def stores(tmp_path):
    """factory(namespace, public=None, keys=None) -> a disk store at tmp_path (closed after)."""
    made: list[TieredKVStore] = []

    def make(namespace: str = "", public: str | None = None, keys: StoreKeys | None = None):
        made.append(TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path,
                                              namespace=namespace, public_namespace=public,
                                              auth_key=keys)))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_each_namespace_runs_its_own_calibration(stores, keys):
    acme = stores("acme", keys=keys)
    CalibrationBook.of_store(acme).put(record(0.5))
    config, stats = calibrated(acme).resolve(BlendConfig())
    assert (config.selector, config.ratio, stats.ratio) == ("epic", 0.5, 0.5)
    other = calibrated(acme).for_store(lambda: acme.namespaced("globex"))
    config, stats = other.resolve(BlendConfig())
    assert (config.selector, config.ratio, stats) == ("preview", 0.2, None)
    assert calibrated(stores("", keys=keys)).record is None
    # shared only where the store opts in to the namespace that wrote it
    assert calibrated(stores("globex", public="acme", keys=keys)).record == record(0.5)


def test_a_keyed_store_never_runs_an_unsigned_or_forged_record(stores, tmp_path):
    acme = stores("acme", keys=KEYS)
    path = CalibrationBook.of_store(acme).put(record(0.5))
    path.write_text(record(1.0).to_json())  # unsigned, a valid checksum
    default = calibrated(acme)
    for _ in range(3):
        config, stats = default.resolve(BlendConfig())
        assert (config.ratio, stats) == (0.2, None)
    # the plain default namespace's folder is not this store's: a record there is not read
    CalibrationBook.beside(tmp_path).put(record(1.0))
    assert calibrated(stores("", keys=KEYS)).record is None


def test_a_calibration_without_a_ratio_runs_a_full_prefill(stores):
    store = stores()
    CalibrationBook.of_store(store).put(record(None))
    config, stats = calibrated(store).resolve(BlendConfig())
    assert config.mode == "full" and stats.ratio is None
    explicit = BlendConfig(selector="epic", ratio=0.3)
    assert calibrated(store).resolve(explicit) == (explicit, None)


def test_use_refuses_what_the_engine_cannot_run(stores):
    default = calibrated(stores())
    with pytest.raises(ValueError, match="selector 'nope'"):
        default.use(record(selector="nope"))
    with pytest.raises(ValueError, match="CalibrationRecord or None"):
        default.use({"ratio": 0.5})  # type: ignore[arg-type]
    default.use(record(0.3))
    assert default.resolve(BlendConfig())[0].ratio == 0.3
    with pytest.raises(ValueError, match="a store"):
        CalibratedDefault(lambda: (M, T))


@pytest.mark.parametrize("ratio", [1.0, None], ids=["chose-1.0", "none-met"])
def test_a_calibration_that_recomputes_everything_runs_the_exact_full_prefill(stores, ratio):
    plain = stores("")
    CalibrationBook.of_store(plain).put(record(ratio))
    config, stats = calibrated(plain).resolve(BlendConfig())
    assert config.mode == "full" and stats is not None and stats.ratio == ratio


def test_an_in_memory_store_names_the_one_line_fix(tmp_path, monkeypatch, caplog):
    import logging

    import blendrag.store.config as store_config
    from blendrag.store.ram import MemoryKVStore

    monkeypatch.setattr(store_config, "DEFAULT_DISK_DIR", tmp_path)
    memory = MemoryKVStore()
    with caplog.at_level(logging.WARNING):
        calibrated(memory).resolve(BlendConfig())
    assert "is where `blendrag calibrate`" in caplog.text
    assert "store=TieredKVStore(StoreConfig())" in caplog.text
    caplog.clear()
    CalibrationBook.beside(tmp_path).put(record(0.5))  # what `blendrag calibrate` kept
    with caplog.at_level(logging.WARNING):
        config, stats = calibrated(memory).resolve(BlendConfig())
    assert stats is None and "holds a calibration of this model" in caplog.text
