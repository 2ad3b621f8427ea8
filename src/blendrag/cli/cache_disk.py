"""What `blendrag cache stats` reads of a disk tier: its index rows and each entry's header,
for the whole store or one namespace's entries (stored names carry the namespace id:
``store/names.py``). Everything read is untrusted: a row or an entry that cannot be read (a
file name leading out of the store, an entry the codec refuses) is counted as ``other``, never
followed and never a traceback. Inspecting changes nothing: the index is opened read-only.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blendrag.store.auth import StoreKeys

KINDS = ("chunks", "prefixes", "other")


def disk_stats(directory: Path, ns_id: str = "", keys: StoreKeys | None = None,
               ) -> dict[str, object]:
    """The disk tier at ``directory``: entries, bytes, budget, lifetime look-ups, chunk and
    prefix entries and unreadable ones (``other``), entry files no row references, the
    entries of each namespace id (``namespaces``). With
    ``ns_id`` (a namespace's id), the entries, bytes and kinds are that namespace's alone and
    ``store_entries``/``store_used_bytes`` the whole tier's. With ``keys``, an entry is read
    only once its tag verifies (a forged one is ``other``)."""
    from blendrag.store.disk import DiskTier

    if not (directory / "cache.db").exists():  # inspecting must not create a store
        return {"dir": str(directory), "exists": False}
    tier = DiskTier(directory, budget_bytes=None, tidy=False)  # inspecting removes nothing
    try:
        usage = tier.usage()
        hits, misses = tier.lifetime_counts()
    except TypeError as exc:  # a settings row of the wrong type: the index itself is damaged
        raise ValueError(f"damaged settings in {directory / 'cache.db'}: {exc}") from None
    finally:
        tier.close()
    rows = index_rows(directory)
    mine = rows if not ns_id else [r for r in rows if namespace_of(r[0]) == ns_id]
    kinds = _kinds(directory, mine, keys)
    out: dict[str, object] = {
        "dir": str(directory), "exists": True, "entries": usage.entries,
        "used_bytes": usage.used_bytes, "budget_bytes": usage.budget_bytes,
        "lifetime_hits": hits, "lifetime_misses": misses, **kinds,
        "unreferenced": _unreferenced(directory, rows), "namespaces": _per_namespace(rows)}
    if ns_id:
        out.update(namespace=ns_id, store_entries=usage.entries,
                   store_used_bytes=usage.used_bytes, entries=len(mine),
                   used_bytes=sum(k["bytes"] for k in kinds.values()))
    return out


def _per_namespace(rows: list[tuple]) -> dict[str, int]:
    """The entries of each namespace id among ``rows`` ("" the default namespace)."""
    counts: dict[str, int] = {}
    for key, _, _ in rows:
        ns = namespace_of(key)
        counts[ns] = counts.get(ns, 0) + 1
    return counts


def namespace_count(directory: Path, ns_id: str) -> int:
    """The disk tier's entries of the namespace ``ns_id``."""
    if not (directory / "cache.db").exists():
        return 0
    return sum(1 for key, _, _ in index_rows(directory) if namespace_of(key) == ns_id)


def namespace_of(key: object) -> str:
    """The namespace id of an index row's key ("" for the default namespace without keys)."""
    from blendrag.store.names import split

    return split(key if isinstance(key, str) else str(key))[0]


def index_rows(directory: Path) -> list[tuple]:
    """(key, filename, size) of every index row; the SQLite index is opened read-only so that
    inspecting changes nothing."""
    con = sqlite3.connect(f"file:{directory / 'cache.db'}?mode=ro", uri=True)
    try:
        return con.execute("SELECT key, filename, size FROM Cache").fetchall()
    finally:
        con.close()


def _kinds(directory: Path, rows: list[tuple], keys: StoreKeys | None,
           ) -> dict[str, dict[str, int]]:
    """Entries, tokens and bytes of chunk and prefix entries (plus unreadable ones), from the
    entry headers."""
    from blendrag.store.codec import open_entry

    out = {k: {"entries": 0, "tokens": 0, "bytes": 0} for k in KINDS}
    for key, filename, size in rows:
        kind, tokens = "other", 0
        path = _inside(directory, filename)
        if path is not None:
            try:
                with open_entry(path, str(key), keys) as entry:
                    tokens = len(entry.token_ids)
                    # a prefix's KV is computed after nothing: no prefix hash, no context tag
                    after_nothing = not entry.prefix_hash and not entry.context_tag
                    kind = "prefixes" if after_nothing else "chunks"
            except Exception:  # noqa: BLE001 - an inspector counts what it cannot read, whatever
                # the bytes made the codec raise (EntryError, or a bug of its), and goes on
                kind, tokens = "other", 0
        out[kind]["entries"] += 1
        out[kind]["tokens"] += tokens
        out[kind]["bytes"] += size if isinstance(size, int) and size > 0 else 0
    return out


def _inside(directory: Path, filename: object) -> Path | None:
    """The entry file an index row names, if it is a relative path inside ``directory`` (a
    planted row naming ``/etc/passwd`` or ``../x`` is never opened); else None."""
    if not isinstance(filename, str) or not filename or "\0" in filename:
        return None
    norm = os.path.normpath(filename)
    if os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
        return None
    return directory / norm


def _unreferenced(directory: Path, rows: list[tuple]) -> dict[str, int]:
    """Entry files no index row references (a writer killed mid-write, an index that was
    removed): the store removes them when it next opens the folder."""
    from blendrag.store.disk_files import entry_files

    known = {os.path.normpath(filename) for _, filename, _ in rows
             if isinstance(filename, str) and filename and "\0" not in filename}
    files = [f for f in entry_files(directory) if os.path.normpath(f) not in known]
    size = 0
    for f in files:
        with contextlib.suppress(OSError):  # removed meanwhile
            size += (directory / f).stat().st_size
    return {"files": len(files), "bytes": size}
