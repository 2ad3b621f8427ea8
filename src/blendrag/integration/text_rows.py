"""Where a persisted ``ChunkTextIndex`` keeps its texts: one SQLite file of plain text rows.

``<folder>/texts.sqlite3`` holds ``texts(id, digest, text)``; only rows whose ``text`` is a
SQLite TEXT value are read, any other row (a BLOB, a number, a pickle planted by someone who
can write the folder) is dropped with a warning and deleted. Nothing read from the file is ever
unpickled or evaluated. Several processes may add texts at once (SQLite locking, WAL journal);
``rows_after(id)`` reads only what was added since the last read.

A folder written by earlier versions (a diskcache ``cache.db``) is read once, the same way:
plain string rows are copied into the new table, pickled rows and file rows pointing outside the
folder are dropped with a warning; the old file is left as it was.

Where the store has keys (``keys``, the store's ``StoreKeys``), rows go to ``signed_texts``
(``RowSeal``): each carries an HMAC tag over the index's namespace, its digest and
its text, checked when the row is read (a row that fails is ignored, never used to lay out a
prompt); its digest is keyed (an HMAC, not a SHA-256 anyone can compute from a guessed
passage); with ``encrypt`` the text is stored encrypted (the store's AES-256-GCM), so neither
the file nor its WAL holds a passage in clear. The unsigned ``texts`` table and an old
``cache.db`` are never read then: their rows are not signed.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from blendrag.store.auth import StoreKeys
from blendrag.store.errors import AuthError
from blendrag.store.sealed import require_cipher, seal, unseal

log = logging.getLogger(__name__)

FILE = "texts.sqlite3"
_LEGACY = "cache.db"
_RAW, _TEXT_FILE = 1, 3  # diskcache's modes for a str kept in the row / in a file beside it
_SCHEMA = """
CREATE TABLE IF NOT EXISTS texts (id INTEGER PRIMARY KEY, digest TEXT UNIQUE NOT NULL,
                                  text NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signed_texts (id INTEGER PRIMARY KEY, digest TEXT UNIQUE NOT NULL,
                                         text NOT NULL, tag TEXT NOT NULL);
"""


def digest(text: str) -> str:
    return hashlib.sha256(_utf8(text)).hexdigest()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Refused:
    """Why a signed row was not used."""

    reason: str


class RowSeal:
    """What a row of an index with keys holds: a keyed digest (``keys.name``), the text (sealed
    with ``encrypt``: ``store/sealed.py``, the digest and namespace as associated data) and a
    tag (``keys.sign``) over the namespace, the digest and the text."""

    def __init__(self, keys: StoreKeys, encrypt: bool, namespace: str) -> None:
        if not isinstance(keys, StoreKeys):
            raise ValueError(f"text index keys must be StoreKeys, got {type(keys).__name__}")
        if encrypt:
            require_cipher()
        self.keys, self.encrypt, self.namespace = keys, encrypt, namespace

    def pack(self, text: str) -> tuple[str, str | bytes, str]:
        """(digest, stored text, tag) of a new row."""
        key = self.keys.name("text-index", self.namespace, text)
        stored: str | bytes = seal(_utf8(text), self._bound(key), self.keys) if self.encrypt \
            else text
        return key, stored, self.keys.sign(self._message(key, text))

    def unpack(self, key: object, stored: object, tag: object) -> str | Refused:
        """The text of a row, or why it is refused (a tag that does not verify, a text that
        does not decrypt, a plain text where texts are encrypted)."""
        if not isinstance(key, str) or not isinstance(tag, str):
            return Refused("malformed row")
        if self.encrypt:
            if not isinstance(stored, bytes):
                return Refused("not encrypted (this index encrypts every text)")
            try:
                text = unseal(stored, self._bound(key), self.keys).decode("utf-8", "surrogatepass")
            except (AuthError, UnicodeDecodeError) as exc:
                return Refused(str(exc))
        elif isinstance(stored, str):
            text = stored
        else:
            return Refused("not plain text")
        why = self.keys.verify(tag, self._message(key, text))
        return text if why is None else Refused(why)

    def _bound(self, key: str) -> str:
        return f"text-index\0{self.namespace}\0{key}"

    def _message(self, key: str, text: str) -> bytes:
        return b"\0".join((b"text-index", self.namespace.encode(), key.encode(), _utf8(text)))


class TextRows:
    """The text rows of one folder (created if missing); signed, and encrypted with
    ``encrypt``, where ``keys`` are given (the module docstring), under ``namespace``."""

    def __init__(self, folder: str | Path, timeout_s: float = 30.0, *,
                 keys: StoreKeys | None = None, encrypt: bool = False,
                 namespace: str = "") -> None:
        self._seal = RowSeal(keys, encrypt, namespace) if keys is not None else None
        if encrypt and keys is None:
            raise ValueError("an encrypted text index needs the store's keys (keys=StoreKeys)")
        self.folder = Path(folder)
        for path in (self.folder, self.folder / FILE):  # SQLite would follow a planted link
            if path.is_symlink():
                raise ValueError(f"text index: {path} is a symbolic link; the index is kept "
                                 "only in a real folder (remove the link)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # one connection, used under the lock: requests run in worker threads
        self._db = sqlite3.connect(str(self.folder / FILE), timeout=timeout_s,
                                   check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            if self._seal is None:
                self._migrate_legacy()
            else:
                self._warn_unsigned()
        except sqlite3.DatabaseError as exc:  # the file's bytes are untrusted
            self._db.close()
            raise ValueError(f"text index {self.folder / FILE} cannot be used ({exc}): not a "
                             "text index this version reads (damaged, planted or locked); move "
                             "it away and ingest the texts again") from None

    def insert(self, texts: Iterable[str]) -> None:
        """Insert texts (those already there are skipped), in one transaction."""
        if self._seal is not None:
            sql = "INSERT OR IGNORE INTO signed_texts (digest, text, tag) VALUES (?, ?, ?)"
            rows: list[tuple] = [self._seal.pack(t) for t in texts]
        else:
            sql = "INSERT OR IGNORE INTO texts (digest, text) VALUES (?, ?)"
            rows = [(digest(t), t) for t in texts]
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @property
    def _table(self) -> str:
        return "texts" if self._seal is None else "signed_texts"

    def count_after(self, last_id: int) -> int:
        with self._lock:
            return self._db.execute(f"SELECT COUNT(*) FROM {self._table} WHERE id > ?",
                                    (last_id,)).fetchone()[0]

    def rows_after(self, last_id: int, batch: int = 50_000) -> Iterator[tuple[int, str]]:
        """(id, text) of the rows added after ``last_id``, in id order; rows that are not plain
        text are dropped (warning) and deleted; with keys, rows whose tag or encryption fails
        are ignored (warning; kept: they may be signed with a key this process lacks)."""
        if self._seal is not None:
            yield from self._signed_after(self._seal, last_id, batch)
            return
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

    def _signed_after(self, seal: RowSeal, last_id: int,
                      batch: int) -> Iterator[tuple[int, str]]:
        refused: list[int] = []
        why = ""
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, digest, text, tag FROM signed_texts WHERE id > ? ORDER BY id "
                    "LIMIT ?", (last_id, batch)).fetchall()
            if not rows:
                break
            for row_id, key, stored, tag in rows:
                text = seal.unpack(key, stored, tag)
                if isinstance(text, Refused):
                    refused.append(row_id)
                    why = text.reason
                else:
                    yield row_id, text
            last_id = rows[-1][0]
        if refused:
            log.warning("text index %s: ignored %d row(s) that this store's keys do not "
                        "authenticate (ids %s; %s): never used to lay out a prompt",
                        self.folder, len(refused), refused[:5], why)

    def _warn_unsigned(self) -> None:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM texts").fetchone()
        if count:  # never deleted here: a process without keys may still share the folder
            log.warning("text index %s: %d unsigned row(s) of an index without keys ignored "
                        "(this store has keys; record the texts again, and remove the old "
                        "folder: those rows hold their texts in clear)", self.folder, count)

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
