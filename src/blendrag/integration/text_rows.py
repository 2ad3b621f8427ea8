"""Where a persisted ``ChunkTextIndex`` keeps its texts: one SQLite file of plain text rows.

``<folder>/texts.sqlite3`` holds ``texts(id, digest, text)``; only rows whose ``text`` is a
SQLite TEXT value are read, any other row (a BLOB, a number, a pickle planted by someone who
can write the folder) is dropped with a warning and deleted. Nothing read from the file is ever
unpickled or evaluated. Several processes may add texts at once (SQLite locking, WAL journal);
``rows_after(id)`` reads only what was added since the last read.

A folder written by earlier versions (a diskcache ``cache.db``) is read once, the same way:
plain string rows are copied into the new table, pickled rows and file rows pointing outside the
folder are dropped with a warning; the old file is left as it was.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "texts.sqlite3"
_LEGACY = "cache.db"
_RAW, _TEXT_FILE = 1, 3  # diskcache's modes for a str kept in the row / in a file beside it
_SCHEMA = """
CREATE TABLE IF NOT EXISTS texts (id INTEGER PRIMARY KEY, digest TEXT UNIQUE NOT NULL,
                                  text NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class TextRows:
    """The text rows of one folder (created if missing)."""

    def __init__(self, folder: str | Path, timeout_s: float = 30.0) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # one connection, used under the lock: requests run in worker threads
        self._db = sqlite3.connect(str(self.folder / FILE), timeout=timeout_s,
                                   check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._migrate_legacy()

    def insert(self, texts: Iterable[str]) -> None:
        """Insert texts (those already there are skipped), in one transaction."""
        rows = [(digest(t), t) for t in texts]
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR IGNORE INTO texts (digest, text) VALUES (?, ?)",
                                     rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def count_after(self, last_id: int) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM texts WHERE id > ?",
                                    (last_id,)).fetchone()[0]

    def rows_after(self, last_id: int, batch: int = 50_000) -> Iterator[tuple[int, str]]:
        """(id, text) of the rows added after ``last_id``, in id order; rows that are not plain
        text are dropped (warning) and deleted."""
        bad: list[int] = []
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, text FROM texts WHERE id > ? ORDER BY id LIMIT ?",
                    (last_id, batch)).fetchall()
            if not rows:
                break
            for row_id, text in rows:
                if isinstance(text, str):
                    yield row_id, text
                else:
                    bad.append(row_id)
            last_id = rows[-1][0]
        if bad:
            log.warning("text index %s: dropped %d row(s) that are not plain text (ids %s)",
                        self.folder, len(bad), bad[:5])
            self._delete(bad)

    def _delete(self, ids: list[int]) -> None:
        try:
            with self._lock:
                self._db.executemany("DELETE FROM texts WHERE id = ?", [(i,) for i in ids])
        except sqlite3.Error as exc:  # a read-only folder: the rows stay dropped in memory only
            log.warning("text index %s: could not delete the dropped rows: %s", self.folder, exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- the diskcache folder of earlier versions --------------------------------------------

    def _migrate_legacy(self) -> None:
        path = self.folder / _LEGACY
        with self._lock:
            done = self._db.execute("SELECT 1 FROM meta WHERE key = 'legacy'").fetchone()
        if done or not path.is_file():
            return
        texts, dropped = [], 0
        try:
            legacy = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = legacy.execute("SELECT mode, filename, value FROM Cache").fetchall()
            finally:
                legacy.close()
        except sqlite3.Error as exc:
            log.warning("text index %s: cannot read the old %s (%s); ignored", self.folder,
                        _LEGACY, exc)
            rows = []
        for mode, filename, value in rows:
            text = self._legacy_text(mode, filename, value)
            if text is None:
                dropped += 1
            else:
                texts.append(text)
        if dropped:
            log.warning("text index %s: dropped %d row(s) of the old %s that are not plain text "
                        "(never unpickled)", self.folder, dropped, _LEGACY)
        self.insert(texts)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('legacy', 'read')")

    def _legacy_text(self, mode: object, filename: object, value: object) -> str | None:
        if mode == _RAW and isinstance(value, str):
            return value
        if mode == _TEXT_FILE and isinstance(filename, str):
            file = (self.folder / filename).resolve()
            if file.is_relative_to(self.folder.resolve()) and file.is_file():
                try:
                    return file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    return None
        return None
