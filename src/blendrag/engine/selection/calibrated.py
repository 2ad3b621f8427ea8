"""What the default ``BlendConfig()`` runs on an engine: the calibration its store keeps for
its model (``blendrag.store.calibration``; measured by ``blendrag calibrate``), else the
built-in default, preview at 0.20, whose fidelity on this model nobody has measured (said once,
naming the command).

Only a config that leaves the selector, the ratio and the options to the engine
(``BlendConfig.calibrated``) is replaced: an explicit one always runs as given. A calibration
of another model or tokenizer is never used: the fingerprints decide. A calibration in which
no ratio met its target runs a full prefill (exact), and says so in the request's stats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from blendrag.config import BlendConfig
from blendrag.engine.request.stats import CalibrationStats
from blendrag.store.calibration import CalibrationBook, CalibrationRecord

log = logging.getLogger(__name__)

FULL = BlendConfig(mode="full")
_UNREAD = object()


class CalibratedDefault:
    """The calibration an engine's default config runs with. ``identity()``: the engine's
    (model fingerprint, tokenizer fingerprint), current when asked; ``disk_dir()``: the store's
    disk folder, where its calibration book is."""

    def __init__(self, identity: Callable[[], tuple[str, str]],
                 disk_dir: Callable[[], Path | None]) -> None:
        self._identity, self._disk_dir = identity, disk_dir
        self._record: CalibrationRecord | None | object = _UNREAD
        self._warned = False

    @property
    def record(self) -> CalibrationRecord | None:
        """The calibration in use: set with ``use``, else the latest the store's book holds for
        this model and tokenizer (read once), else None."""
        if self._record is _UNREAD:
            model, tokenizer = self._identity()
            self._record = CalibrationBook.beside(self._disk_dir()).latest(model, tokenizer)
        return self._record if isinstance(self._record, CalibrationRecord) else None

    def use(self, record: CalibrationRecord | None) -> None:
        """Run the default config with ``record`` (None: without a calibration; a ValueError
        for another model's or tokenizer's)."""
        if record is not None and (record.model, record.tokenizer) != self._identity():
            raise ValueError("this calibration was made on another model or tokenizer (their "
                             "fingerprints differ); calibrate this engine's")
        self._record = record

    def forget(self) -> None:
        """Read the store's book again at the next request (the store was replaced)."""
        self._record = _UNREAD

    def resolve(self, config: BlendConfig) -> tuple[BlendConfig, CalibrationStats | None]:
        """The config a request runs, and what the calibration says of it (None: none used)."""
        if not config.calibrated:
            return config, None
        record = self.record
        if record is None:
            if not self._warned:
                self._warned = True
                log.warning("no calibration of this model in the store: the default blend runs "
                            "%s, whose fidelity on this model has not been measured; measure it "
                            "with `blendrag calibrate --model ... --corpus ...` (or precompute "
                            "--calibrate)", config.label)
            return config, None
        summary = CalibrationStats(**record.summary())
        if record.ratio is None:  # no ratio kept full prefill's answers: full prefill does
            return FULL, summary
        return BlendConfig(selector=record.selector, ratio=record.ratio), summary
