"""Calibration records, kept beside a store's entries: for one model (and tokenizer) and one
corpus, the smallest recompute ratio whose whole answers met a fidelity target, and the
frontier it was chosen from (``blendrag.calibration`` measures them).

A store with a disk tier keeps its records in ``<disk_dir>/calibrations/``, one JSON file per
(model, tokenizer, corpus), each written whole (a temporary file renamed over it) and carrying
the SHA-256 of its content: a damaged or foreign file is a miss, said once in a warning, never
a crash and never another model's ratio. Without a disk tier the records live as long as the
book object.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1


@dataclass(frozen=True)
class FrontierPoint:
    """One selector at one ratio over the calibration prompts: the share of whole answers equal
    to full prefill's, the mean answer KL, TTFT against full prefill's (speed-up), and the
    number of prompts."""

    selector: str
    ratio: float
    same_answer: float
    answer_kl: float
    speedup: float
    prompts: int = 0  # how many prompts the shares are over (0: not recorded)


@dataclass(frozen=True)
class CalibrationRecord:
    """What a calibration found for ``model`` (its fingerprint), ``tokenizer`` (its
    fingerprint) and ``corpus`` (a hash of the passages' texts): ``selector`` at ``ratio`` is the
    cheapest that met ``target`` (ratio None: none did; a full prefill keeps the answers);
    ``frontier`` every point measured; ``flow`` what ran (prompt construction, chunk prefix,
    ingestion context); ``prompts`` how many; ``seconds`` how long it took; ``created`` when
    (Unix time)."""

    model: str
    tokenizer: str
    corpus: str
    selector: str
    ratio: float | None
    target: dict
    frontier: tuple[FrontierPoint, ...]
    flow: str
    prompts: int
    seconds: float
    created: float = field(default_factory=time.time)

    def point(self) -> FrontierPoint | None:
        """The frontier point of the chosen selector and ratio (None: none chosen)."""
        return next((p for p in self.frontier
                     if p.selector == self.selector and p.ratio == self.ratio), None)

    def summary(self) -> dict:
        """What a request reports of the calibration it ran with (JSON-able)."""
        point = self.point()
        return {"selector": self.selector, "ratio": self.ratio, "target": self.target,
                "same_answer": None if point is None else point.same_answer,
                "answer_kl": None if point is None else point.answer_kl,
                "prompts": self.prompts, "corpus": self.corpus[:12],
                "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.created))}

    def to_json(self) -> str:
        body = asdict(self)
        text = json.dumps(body, sort_keys=True)
        return json.dumps({"format": FORMAT, "sha256": _sha(text), "record": body},
                          sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> CalibrationRecord:
        """ValueError for anything but a whole, unchanged record of this format."""
        try:
            outer = json.loads(text)
            body = outer["record"]
            if outer.get("format") != FORMAT or outer.get("sha256") != _sha(
                    json.dumps(body, sort_keys=True)):
                raise ValueError("checksum or format mismatch")
            frontier = tuple(FrontierPoint(**p) for p in body.pop("frontier"))
            return cls(frontier=frontier, **body)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a calibration record ({type(exc).__name__}: {exc})") from None


class CalibrationBook:
    """The calibration records of one store: ``folder`` (``<disk_dir>/calibrations``), or in
    memory when None."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._memory: dict[str, CalibrationRecord] = {}
        self._warned: set[str] = set()

    @classmethod
    def beside(cls, disk_dir: Path | None) -> CalibrationBook:
        """The book of a store whose disk tier is ``disk_dir`` (None: in memory)."""
        return cls(None if disk_dir is None else Path(disk_dir) / "calibrations")

    def put(self, record: CalibrationRecord) -> Path | None:
        """Keep ``record`` (replacing the one of the same model, tokenizer and corpus); the file
        written, None in memory."""
        name = _name(record.model, record.tokenizer, record.corpus)
        self._memory[name] = record
        if self.folder is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(record.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def latest(self, model: str, tokenizer: str) -> CalibrationRecord | None:
        """The most recent record of ``model`` with ``tokenizer`` (any corpus), or None."""
        found = [r for r in self.records() if r.model == model and r.tokenizer == tokenizer]
        return max(found, key=lambda r: r.created, default=None)

    def records(self) -> list[CalibrationRecord]:
        """Every readable record (a damaged file is skipped, with one warning)."""
        if self.folder is None or not self.folder.is_dir():
            return list(self._memory.values())
        out = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                record = CalibrationRecord.from_json(path.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                if path.name not in self._warned:
                    self._warned.add(path.name)
                    log.warning("calibration record %s is damaged and is not used (%s); run "
                                "blendrag calibrate again", path, exc)
                continue
            if path.name != _name(record.model, record.tokenizer, record.corpus):
                continue  # a file renamed or copied over another: not this one's record
            out.append(record)
        return out


def corpus_id(texts: list[str]) -> str:
    """A corpus's identity: the SHA-256 of its passages' texts, in order."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def _name(model: str, tokenizer: str, corpus: str) -> str:
    return _sha(f"{model}\0{tokenizer}")[:24] + "-" + corpus[:16] + ".json"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
