"""A calibration's progress, saved prompt by prompt, so that the same command run again after
a stop (a kill, a closed laptop, a budget) goes on where it was instead of starting over.

One JSON-lines file per calibration *settings* (model, tokenizer, corpus, prompts' draw, flow,
instruction, selectors, ratios, answer length, and the store's namespace: ``settings_id``),
named by their digest in the store's ``calibration-progress`` folder (a namespace other than
the default one in ``calibration-progress/<namespace id>/``, as its records are): a first line
with the settings, then one line per prompt measured (its index and each config's result).
Prompt i is the same prompt whatever the count asked for (``make_prompts`` draws them in
order), so a run with another ``--prompts`` or ``--budget`` takes the saved prompts too. The
file is removed once the record is kept. Two runs of the same settings at once do not share the
file: the first to load it holds it (an advisory lock beside it) and the second saves nothing,
with a warning. A calibration on labelled questions (``qa_run.py``) keeps its rows the same
way, question by question (``SavedRows``: the file format is shared, each result's fields are
its own).

The folder is part of the store: its bytes are untrusted. Every line is checked field by field
(a line that is not a prompt's result ends the saved part there: the prompts after it are
measured again); with store keys each line is signed and a line whose tag fails is refused the
same way. A planted file can therefore cost time, never choose a ratio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Generic, Protocol, TypeVar

from blendrag.store.auth import StoreKeys

log = logging.getLogger(__name__)

FOLDER = "calibration-progress"
MAX_LINE = 1 << 16  # a prompt's line is a few hundred bytes


@dataclass(frozen=True)
class Result:
    """One config's result on one prompt (full prefill's: selector and ratio None)."""

    selector: str | None
    ratio: float | None
    same_answer: bool
    same_first_sentence: bool
    answer_kl: float
    ttft_s: float


class ConfigResult(Protocol):
    """A result of one config: full prefill's has no selector and no ratio."""

    @property
    def selector(self) -> str | None: ...

    @property
    def ratio(self) -> float | None: ...


R = TypeVar("R", bound=ConfigResult)


def settings_id(settings: dict) -> str:
    """The digest that names a calibration's saved progress."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]


class SavedRows(Generic[R]):
    """The saved rows (one a prompt or question: full prefill's result, then each config's) of
    one calibration's ``settings`` under ``store_dir`` (None: nothing saved, a calibration in
    memory), in the namespace ``ns_id`` (the store's ``Names.ns_id``; "" the default one),
    signed with ``keys`` where given. A subclass says how one result is written (``dump``) and
    read back, checked field by field (``parse``)."""

    def __init__(self, store_dir: Path | None, settings: dict,
                 keys: StoreKeys | None = None, ns_id: str = "") -> None:
        # the namespace in the settings too: a signed line copied from another tenant's file
        # names other settings
        self.settings = {**settings, "namespace": ns_id} if ns_id else settings
        self.keys = keys
        folder = None if store_dir is None else Path(store_dir) / FOLDER
        if folder is not None and ns_id:
            folder = folder / ns_id
        self.path = (None if folder is None
                     else folder / f"{settings_id(self.settings)}.jsonl")
        # the folders this writes in: the store's own, never a planted link's target
        self._inner = [] if folder is None else [folder] + ([folder.parent] if ns_id else [])
        self._lock: IO[bytes] | None = None

    def dump(self, result: R) -> list:
        """One result as a JSON list."""
        raise NotImplementedError

    def parse(self, item: object) -> R | None:
        """A saved result, checked field by field; None for anything else."""
        raise NotImplementedError

    def load(self) -> list[list[R]]:
        """The prompts saved by an earlier run of the same settings, in order (prompt 0, 1,
        ...): up to the first line that is missing, damaged or not signed."""
        if self.path is None or not self.path.is_file() or self.path.is_symlink():
            return []
        rows: list[list[R]] = []
        with self.path.open("rb") as f:
            lines = iter(f)
            if self._parse(next(lines, b"")) != {"settings": self.settings}:
                return []
            for raw in lines:
                row = self._results(self._parse(raw), len(rows))
                if row is None:
                    log.warning("calibration progress %s: line %d is not a prompt's result; "
                                "measuring from prompt %d again", self.path, len(rows) + 2,
                                len(rows))
                    break
                rows.append(row)
        return rows

    def start(self, rows: list[list[R]]) -> None:
        """Write the settings line and ``rows`` (what this run goes on from) afresh."""
        if self.path is None:
            return
        self._check_inner()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a file of its own (mkstemp: created, never a planted link followed, nor another
        # run's of the same settings), then renamed over the progress
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self._line({"settings": self.settings}))
                for i, row in enumerate(rows):
                    f.write(self._line(self._row_doc(i, row)))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def add(self, index: int, row: list[R]) -> None:
        """Append prompt ``index``'s results (flushed: a kill after this keeps them); a
        progress file replaced by a link is not followed (OSError)."""
        if self.path is None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "a") as f:
            f.write(self._line(self._row_doc(index, row)))
            f.flush()
            os.fsync(f.fileno())

    def done(self) -> None:
        """The record is kept: the progress is no longer needed (its file removed, its hold
        let go)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        self.release()

    def claim(self) -> None:
        """Hold this settings' progress for a run (an advisory lock on a file beside it, let go
        by :meth:`release` or when the process ends); while another run holds it, this one
        saves nothing (warned)."""
        if self.path is not None and not self._lock_file():
            log.warning("calibration progress %s: another calibration of the same settings is "
                        "running and saving it; this run saves no progress of its own",
                        self.path)
            self.path = None

    def release(self) -> None:
        """Let go of the hold :meth:`claim` took (the progress file stays)."""
        if self._lock is not None:
            self._lock.close()  # closing the file lets its lock go
            self._lock = None

    def _lock_file(self) -> bool:
        """Lock the file beside the progress: False while another run holds it."""
        if self._lock is not None or self.path is None:
            return True
        try:
            import fcntl
        except ImportError:  # no advisory locks on this system: the file is shared as before
            return True
        self._check_inner()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"),
                     os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        lock = os.fdopen(fd, "rb+")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            return False
        self._lock = lock
        return True

    def _check_inner(self) -> None:
        """ValueError when a folder this writes in, or the progress file, is a link."""
        for folder in [*self._inner, *([] if self.path is None else [self.path])]:
            if folder.is_symlink():
                raise ValueError(f"calibration progress: {folder} is a symbolic link; it is "
                                 "written only inside the store (remove the link)")


    def _line(self, doc: dict) -> str:
        body = json.dumps(doc, sort_keys=True)
        tag = self.keys.sign(body.encode()) if self.keys is not None else ""
        return json.dumps({"body": body, "tag": tag}) + "\n"

    def _parse(self, raw: bytes) -> object:
        if not raw or len(raw) > MAX_LINE:
            return None
        try:
            outer = json.loads(raw)
            body, tag = outer["body"], outer["tag"]
            if not isinstance(body, str) or not isinstance(tag, str):
                return None
            if self.keys is not None and self.keys.verify(tag, body.encode()) is not None:
                return None
            return json.loads(body)
        except (ValueError, KeyError, TypeError, RecursionError):
            return None


    def _row_doc(self, index: int, row: list[R]) -> dict:
        # the settings' digest in each line: a signed line copied from another calibration's
        # file (another answer length, corpus, flow) is not this one's
        return {"settings": settings_id(self.settings), "prompt": index,
                "results": [self.dump(r) for r in row]}

    def _results(self, doc: object, index: int) -> list[R] | None:
        """A saved line's results, checked field by field; None for anything else."""
        if (not isinstance(doc, dict) or doc.get("prompt") != index
                or doc.get("settings") != settings_id(self.settings)):
            return None
        items = doc.get("results")
        if not isinstance(items, list) or not items:
            return None
        out = []
        for item in items:
            result = self.parse(item)
            if result is None:
                return None
            out.append(result)
        if out[0].selector is not None or out[0].ratio is not None:
            return None  # full prefill's row comes first
        return out


@contextmanager
def held(progress: SavedRows | None) -> Iterator[None]:
    """``progress`` held for the run inside (None: nothing saved): another run of the same
    settings at once saves nothing; let go however the run ends (an error, a Ctrl-C)."""
    if progress is not None:
        progress.claim()
    try:
        yield
    finally:
        if progress is not None:
            progress.release()


def is_amount(x: object) -> bool:
    """A finite number >= 0 (not a bool), as a saved KL or time is."""
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= 0)


def is_config(selector: object, ratio: object) -> bool:
    """A saved result's selector and ratio: both None (full prefill) or a name and a ratio in
    (0, 1]."""
    return ((selector is None or isinstance(selector, str))
            and (ratio is None or (isinstance(ratio, (int, float))
                                   and not isinstance(ratio, bool) and 0 < ratio <= 1)))


class SavedProgress(SavedRows[Result]):
    """The saved prompts of a calibration against full prefill's answers (``Result`` rows)."""

    def dump(self, result: Result) -> list:
        r = result
        return [r.selector, r.ratio, r.same_answer, r.same_first_sentence, r.answer_kl,
                r.ttft_s]

    def parse(self, item: object) -> Result | None:
        if not (isinstance(item, list) and len(item) == 6):
            return None
        selector, ratio, same, first, kl, ttft = item
        if not (is_amount(kl) and is_amount(ttft) and isinstance(same, bool)
                and isinstance(first, bool) and is_config(selector, ratio)):
            return None
        return Result(selector, None if ratio is None else float(ratio), same, first,
                      float(kl), float(ttft))
