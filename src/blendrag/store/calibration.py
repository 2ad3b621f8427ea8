"""Calibration records, kept beside a store's entries: for one model (and tokenizer) and one
corpus, the smallest recompute ratio whose whole answers met a fidelity target, and the
frontier it was chosen from (``blendrag.calibration`` measures them).

A store with a disk tier keeps its records in ``<disk_dir>/calibrations/``, one JSON file per
(model, tokenizer, corpus), each written whole (a temporary file renamed over it) and carrying
the SHA-256 of its content. Records belong to a namespace, like entries (``names.py``): the
default namespace without keys keeps them in that folder itself, any other namespace in
``calibrations/<namespace id>/``, so a tenant's records never steer another's requests; a store
whose config names a ``public_namespace`` also reads that namespace's records (its own first).
With store keys every record is signed (HMAC under the active key, over its namespace id, its
file name and its content: a record copied into another namespace or renamed does not verify)
and an unsigned or forged one is refused.

Whatever is read is untrusted: every field is checked (types, finite numbers, a ratio in
(0, 1] — a ratio of 0 would turn recompute off —, a known selector, a date not in the future,
counts). A damaged, forged, foreign or invalid record is a miss, said once per record in a
warning, never an exception and never another model's ratio. Without a disk tier the records
live as long as the book object.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from blendrag.checks import check_at_least, is_finite_number
from blendrag.store.auth import StoreKeys
from blendrag.store.calibration_checks import (
    authenticate,
    check_count,
    check_difference,
    check_fields,
    check_fraction,
    check_target,
    check_text,
    document,
    parse,
    read_bounded,
    sha,
)
from blendrag.store.names import Named, Names

log = logging.getLogger(__name__)

MAX_TEXT = 4096  # characters of a record's free text (its flow's words)
MAX_POINTS = 1024  # frontier points: selectors x ratios
FUTURE_S = 86_400.0  # clock skew allowed to a record's date; later dates are refused
QUALITY_FIELDS = frozenset({"quality", "quality_bound"})  # FrontierPoint's, --qa only
_WARNED: set[tuple[str, str]] = set()  # (file, digest of its bytes): each bad record said once
_WARNED_LOCK = threading.Lock()


@dataclass(frozen=True)
class FrontierPoint:
    """One selector at one ratio over the calibration prompts: the share of whole answers equal
    to full prefill's, the mean answer KL, TTFT against full prefill's (speed-up), and the
    number of prompts. A calibration on labelled questions (``--qa``) also keeps the mean
    answer ``quality`` against the gold answers and ``quality_bound``, the lower confidence
    bound of its mean difference from full prefill's (None elsewhere: not measured)."""

    selector: str
    ratio: float
    same_answer: float
    answer_kl: float
    speedup: float
    prompts: int = 0  # how many prompts the shares are over (0: not recorded)
    quality: float | None = None
    quality_bound: float | None = None

    def __post_init__(self) -> None:
        check_text("FrontierPoint.selector", self.selector, 64)
        for name in ("ratio", "same_answer"):
            check_fraction(f"FrontierPoint.{name}", getattr(self, name))
        for name in ("answer_kl", "speedup"):
            check_at_least(f"FrontierPoint.{name}", getattr(self, name))
        check_count("FrontierPoint.prompts", self.prompts, 0)
        if self.quality is not None:
            check_fraction("FrontierPoint.quality", self.quality)
        if self.quality_bound is not None:
            check_difference("FrontierPoint.quality_bound", self.quality_bound)


@dataclass(frozen=True)
class CalibrationRecord:
    """What a calibration found for ``model`` (its fingerprint), ``tokenizer`` (its
    fingerprint) and ``corpus`` (a hash of the passages' texts): ``selector`` at ``ratio`` is the
    cheapest that met ``target`` (ratio None: none did; a full prefill keeps the answers);
    ``frontier`` every point measured; ``flow`` what ran (prompt construction, chunk prefix,
    ingestion context); ``prompts`` how many; ``seconds`` how long it took; ``created`` when
    (Unix time). ValueError naming the field for anything else (a ratio outside (0, 1], a NaN,
    a date in the future...)."""

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

    def __post_init__(self) -> None:
        for name in ("model", "tokenizer", "corpus"):
            check_text(f"CalibrationRecord.{name}", getattr(self, name), 256)
        check_text("CalibrationRecord.selector", self.selector, 64)
        if self.ratio is not None and not (is_finite_number(self.ratio) and 0 < self.ratio <= 1):
            raise ValueError("CalibrationRecord.ratio must be None or in (0, 1] (0 recomputes "
                             f"nothing), got {self.ratio!r}")
        check_target(self.target)
        if not isinstance(self.frontier, (tuple, list)) or not 1 <= len(self.frontier) <= \
                MAX_POINTS or not all(isinstance(p, FrontierPoint) for p in self.frontier):
            raise ValueError(f"CalibrationRecord.frontier must be 1 to {MAX_POINTS} "
                             "FrontierPoints")
        object.__setattr__(self, "frontier", tuple(self.frontier))
        check_text("CalibrationRecord.flow", self.flow, MAX_TEXT, empty=True)
        check_count("CalibrationRecord.prompts", self.prompts, 1)
        check_at_least("CalibrationRecord.seconds", self.seconds)
        check_at_least("CalibrationRecord.created", self.created)
        if self.created > time.time() + FUTURE_S:
            raise ValueError(f"CalibrationRecord.created is in the future ({self.created!r})")

    def point(self) -> FrontierPoint | None:
        """The frontier point of the chosen selector and ratio (None: none chosen)."""
        return next((p for p in self.frontier
                     if p.selector == self.selector and p.ratio == self.ratio), None)

    def summary(self) -> dict:
        """What a request reports of the calibration it ran with (JSON-able)."""
        point = self.point()
        return {"selector": self.selector, "ratio": self.ratio, "target": dict(self.target),
                "same_answer": None if point is None else point.same_answer,
                "answer_kl": None if point is None else point.answer_kl,
                "prompts": self.prompts, "corpus": self.corpus[:12],
                "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.created))}

    def to_json(self) -> str:
        """The record's file, unsigned."""
        return document(asdict(self), None, "", "")

    @classmethod
    def from_json(cls, text: str) -> CalibrationRecord:
        """ValueError for anything but a whole, unchanged, valid record of this format."""
        return _record(parse(text))


class CalibrationBook:
    """The calibration records of one namespace of a store: ``folder``
    (``<disk_dir>/calibrations[/<ns_id>]``), or in memory when None. ``keys``: the store's keys
    (records signed when written, refused unless signed when read); ``ns_id``: the namespace's
    id (part of what is signed); ``shared``: a book also read, after this one's (the store's
    public namespace); ``selectors``: the selectors a record may choose (None: any name)."""

    def __init__(self, folder: Path | None, *, keys: StoreKeys | None = None, ns_id: str = "",
                 shared: CalibrationBook | None = None,
                 selectors: Collection[str] | None = None) -> None:
        self.folder, self.keys, self.ns_id, self.shared = folder, keys, ns_id, shared
        self.selectors = None if selectors is None else frozenset(selectors)
        self._memory: dict[str, CalibrationRecord] = {}
        self.refused: list[tuple[str, str]] = []  # (file, why) of the last read: not used

    @classmethod
    def of_default_store(cls, selectors: Collection[str] | None = None) -> CalibrationBook:
        """The default namespace's book of the store the command line uses by default
        (``StoreConfig()``'s disk tier, ``~/.cache/blendrag/kv``): where ``blendrag calibrate``
        keeps a record unless told otherwise."""
        from blendrag.store.config import DEFAULT_DISK_DIR

        return cls.beside(DEFAULT_DISK_DIR, selectors=selectors)

    @classmethod
    def beside(cls, disk_dir: Path | None, names: Names | None = None,
               selectors: Collection[str] | None = None) -> CalibrationBook:
        """The book of namespace ``names`` (None: the default one, without keys) of a store
        whose disk tier is ``disk_dir`` (None: in memory)."""
        names = Names() if names is None else names
        folder = None if disk_dir is None else Path(disk_dir) / "calibrations"
        if folder is not None and names.ns_id:
            folder = folder / names.ns_id
        return cls(folder, keys=names.keys, ns_id=names.ns_id, selectors=selectors)

    @classmethod
    def of_store(cls, store: object, selectors: Collection[str] | None = None,
                 ) -> CalibrationBook:
        """The book of ``store``'s namespace, signed with its keys, also reading its public
        namespace's records where its config names one (``StoreConfig.public_namespace``)."""
        disk_dir = getattr(store, "disk_dir", None)
        disk_dir = disk_dir if isinstance(disk_dir, Path) else None
        names = store.names if isinstance(store, Named) else Names()
        book = cls.beside(disk_dir, names, selectors)
        public = getattr(store, "public", None)  # TieredKVStore: the namespace all also read
        if isinstance(public, Names) and public.ns_id != names.ns_id:
            book.shared = cls.beside(disk_dir, public, selectors)
        return book

    def put(self, record: CalibrationRecord) -> Path | None:
        """Keep ``record`` (replacing the one of the same model, tokenizer and corpus), signed
        where the store has keys; the file written, None in memory."""
        name = _name(record.model, record.tokenizer, record.corpus)
        self._memory[name] = record
        if self.folder is None:
            return None
        # the records' folders are the store's own: a planted link would send them elsewhere
        inner = [self.folder] + ([self.folder.parent]
                                 if self.folder.parent.name == "calibrations" else [])
        for folder in inner:  # the store's own folder may be a link its operator made
            if folder.is_symlink():
                raise ValueError(f"calibration records are kept only inside the store: "
                                 f"{folder} is a symbolic link (remove it)")
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(document(asdict(record), self.keys, self.ns_id, name))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def latest(self, model: str, tokenizer: str) -> CalibrationRecord | None:
        """The most recent record of ``model`` with ``tokenizer`` (any corpus) in this
        namespace, else in the shared one, or None."""
        found = [r for r in self.records() if r.model == model and r.tokenizer == tokenizer]
        if not found and self.shared is not None:
            return self.shared.latest(model, tokenizer)
        return max(found, key=lambda r: r.created, default=None)

    def records(self) -> list[CalibrationRecord]:
        """Every record of this namespace that is whole, authentic and valid; the others are
        listed in ``refused`` and said once each in a warning."""
        self.refused = []
        if self.folder is None:
            return list(self._memory.values())
        out = []
        try:  # (is_dir too: a folder this process may not read raises, and a request reads it)
            if not self.folder.is_dir():
                return list(self._memory.values())
            # ".tmp-*.json": a record being written (or a killed writer's), not one to read
            paths = sorted(p for p in self.folder.glob("*.json") if not p.name.startswith("."))
        except OSError as exc:
            self._refuse(self.folder, b"", f"cannot list it: {exc.strerror}")
            return []
        for path in paths:
            record = self._load(path)
            if record is not None:
                out.append(record)
        return out

    def _load(self, path: Path) -> CalibrationRecord | None:
        try:
            data = read_bounded(path)
        except OSError as exc:
            self._refuse(path, b"", f"unreadable: {exc.strerror or exc}")
            return None
        try:
            outer = parse(data.decode())
            if self.keys is not None:
                authenticate(outer, self.keys, self.ns_id, path.name)
            record = _record(outer)
            if path.name != _name(record.model, record.tokenizer, record.corpus):
                raise ValueError("it is another record's, renamed or copied over this one")
            if self.selectors is not None and record.selector not in self.selectors:
                raise ValueError(f"unknown selector {record.selector!r}")
        except ValueError as exc:  # UnicodeDecodeError among them
            self._refuse(path, data, str(exc))
            return None
        return record

    def _refuse(self, path: Path, data: bytes, why: str) -> None:
        self.refused.append((path.name, why))
        said = (str(path), hashlib.sha256(data).hexdigest())
        with _WARNED_LOCK:
            first = said not in _WARNED
            if first:
                if len(_WARNED) > 10_000:  # a folder flooded with bad files: say them again
                    _WARNED.clear()
                _WARNED.add(said)
        (log.warning if first else log.debug)(
            "calibration record %s is damaged or not trusted and is not used (%s); run "
            "`blendrag calibrate` again", path, why)


def corpus_id(texts: list[str]) -> str:
    """A corpus's identity: the SHA-256 of its passages' texts, in order."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


# ---- a record's file -------------------------------------------------------------------

def _record(outer: dict) -> CalibrationRecord:
    """The record of a checked file, each field checked; ValueError otherwise."""
    body = dict(outer["record"])
    check_fields("the record", body, CalibrationRecord)  # a date left out is not "now"
    try:
        points = body.pop("frontier")
        if not isinstance(points, list) or len(points) > MAX_POINTS:
            raise ValueError(f"the frontier must be a list of at most {MAX_POINTS} points")
        for p in points:
            # records written before the answer-quality fields: not measured
            check_fields("a frontier point", p, FrontierPoint, QUALITY_FIELDS)
        frontier = tuple(FrontierPoint(**p) for p in points)
        return CalibrationRecord(frontier=frontier, **body)
    except (KeyError, TypeError, ArithmeticError) as exc:
        raise ValueError(f"not a calibration record ({type(exc).__name__}: {exc})") from None


def _name(model: str, tokenizer: str, corpus: str) -> str:
    return sha(f"{model}\0{tokenizer}")[:24] + "-" + corpus[:16] + ".json"


