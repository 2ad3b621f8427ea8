"""What the default ``BlendConfig()`` runs on an engine: the calibration its store keeps for
its model (``blendrag.store.calibration``; measured by ``blendrag calibrate``), else the
built-in default, preview at 0.20, whose fidelity on this model nobody has measured (said once,
naming the command).

What the store keeps is untrusted: a record is read through ``CalibrationBook``, which refuses
(a miss, said once) any record that is damaged, forged, another namespace's or invalid, and
accepts only a selector of ``blendrag.config.SELECTORS``; so no request fails on what the store
holds, and none runs a ratio of 0.

Only a config that leaves the selector, the ratio and the options to the engine
(``BlendConfig.calibrated``) is replaced: an explicit one always runs as given. A calibration
of another model or tokenizer is never used: the fingerprints decide. A calibration in which
no ratio below 1.0 met its target runs a full prefill (exact, and faster than blend at 1.0),
and says so in the request's stats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from blendrag.config import SELECTORS, BlendConfig
from blendrag.engine.request.stats import CalibrationStats
from blendrag.store.calibration import CalibrationBook, CalibrationRecord

log = logging.getLogger(__name__)

FULL = BlendConfig(mode="full")


class CalibratedDefault:
    """The calibration an engine's default config runs with. ``identity()``: the engine's
    (model fingerprint, tokenizer fingerprint), current when asked; ``store()``: the store
    whose book is read (its namespace's records, verified with its keys, and its public
    namespace's: ``CalibrationBook.of_store``); without it, ``disk_dir()``: the store's disk
    folder, whose default-namespace records are read, unsigned."""

    def __init__(self, identity: Callable[[], tuple[str, str]],
                 disk_dir: Callable[[], Path | None] | None = None, *,
                 store: Callable[[], object] | None = None) -> None:
        if (disk_dir is None) == (store is None):
            raise ValueError("CalibratedDefault reads the book of a store() or of a "
                             "disk_dir(): give one of them")
        self._identity, self._disk_dir, self._store = identity, disk_dir, store
        # (the identity it was chosen for, the record in use, the config it runs), replaced
        # whole: a request reading it while another request reads the book never pairs one
        # record with another's config
        self._chosen: tuple[tuple[str, str], CalibrationRecord | None,
                            BlendConfig] | None = None
        self._warned = False

    def for_store(self, store: Callable[[], object]) -> CalibratedDefault:
        """The same engine's calibration as read from ``store()`` (a namespace's view of the
        store: its own records, never another namespace's)."""
        return CalibratedDefault(self._identity, store=store)

    def book(self) -> CalibrationBook:
        """The calibration book of the engine's store, as it is now."""
        if self._store is not None:
            return CalibrationBook.of_store(self._store(), SELECTORS)
        disk_dir = self._disk_dir() if self._disk_dir is not None else None
        return CalibrationBook.beside(disk_dir, selectors=SELECTORS)

    @property
    def record(self) -> CalibrationRecord | None:
        """The calibration in use: set with ``use``, else the latest valid one the store's book
        holds for this model and tokenizer (read once), else None."""
        return self._current()[0]

    def _current(self) -> tuple[CalibrationRecord | None, BlendConfig]:
        """(the record in use, the config it runs), the book read at the first call and again
        once the model's weights (or tokenizer) are not those it was chosen for."""
        identity = self._identity()
        chosen = self._chosen
        if chosen is None or chosen[0] != identity:
            found = self.book().latest(*identity)
            try:
                return self._set(found, identity)
            except ValueError as exc:  # the book checked it: a config that cannot run it
                log.warning("the store's calibration cannot run (%s): not used", exc)
                return self._set(None, identity)
        return chosen[1], chosen[2]

    def use(self, record: CalibrationRecord | None) -> None:
        """Run the default config with ``record`` (None: without a calibration; a ValueError
        for another model's or tokenizer's, or a selector this engine does not have)."""
        if record is not None and not isinstance(record, CalibrationRecord):
            raise ValueError(f"use_calibration takes a CalibrationRecord or None, got "
                             f"{type(record).__name__}")
        identity = self._identity()
        if record is not None and (record.model, record.tokenizer) != identity:
            raise ValueError("this calibration was made on another model or tokenizer (their "
                             "fingerprints differ); calibrate this engine's")
        if record is not None and record.selector not in SELECTORS:
            raise ValueError(f"this calibration chose selector {record.selector!r}, which is "
                             f"not one of {tuple(SELECTORS)}")
        self._set(record, identity)

    def _set(self, record: CalibrationRecord | None, identity: tuple[str, str],
             ) -> tuple[CalibrationRecord | None, BlendConfig]:
        """Keep ``record`` and the config it runs (a full prefill where no ratio kept full
        prefill's answers) for the model ``identity``, made once here, not at each request."""
        config = FULL
        # a ratio of 1.0 recomputes every token: a full prefill's rows, reached more slowly
        # than by the full prefill itself, which is exact: that is what runs
        if record is not None and record.ratio is not None and record.ratio < 1.0:
            config = BlendConfig(selector=record.selector, ratio=record.ratio)
        self._chosen = (identity, record, config)
        return record, config

    def forget(self) -> None:
        """Read the store's book again at the next request (the store was replaced)."""
        self._chosen = None

    def resolve(self, config: BlendConfig) -> tuple[BlendConfig, CalibrationStats | None]:
        """The config a request runs, and what the calibration says of it (None: none used)."""
        if not config.calibrated:
            return config, None
        record, calibrated = self._current()
        if record is None:
            if not self._warned:
                self._warned = True
                log.warning("%s", self._missing_words(config))
            return config, None
        return calibrated, CalibrationStats(**record.summary())

    def _missing_words(self, config: BlendConfig) -> str:
        """Why the default runs uncalibrated, and the one step that changes it."""
        words = (f"no calibration of this model in the store: the default blend runs "
                 f"{config.label}, whose fidelity on this model has not been measured; measure "
                 f"it with `blendrag calibrate --model ... --corpus ...` (or precompute "
                 f"--calibrate)")
        store = self._store() if self._store is not None else None
        if store is None or getattr(store, "disk_dir", None) is not None:
            return words
        # an in-memory store (from_pretrained's default): the command line's store is another
        model, tokenizer = self._identity()
        found = CalibrationBook.of_default_store(SELECTORS).latest(model, tokenizer)
        there = ("holds a calibration of this model" if found is not None else
                 "is where `blendrag calibrate` and `precompute` keep theirs")
        return (f"{words}. This engine's store is in memory; the command line's default store "
                f"(~/.cache/blendrag/kv) {there}: open it with "
                f"BlendEngine.from_pretrained(..., store=TieredKVStore(StoreConfig()))")
