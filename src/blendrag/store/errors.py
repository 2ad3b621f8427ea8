"""What a read of a stored entry raises when the bytes it finds cannot be the entry's: the
entry reader's checks (``entry_reader.py``, ``tensors.py``) and the readers under them
(``readers.py``) all raise ``EntryError``, which the tiers turn into a logged miss
(``slot.py``)."""

from __future__ import annotations


class EntryError(ValueError):
    """A stored entry that is truncated, corrupt, foreign or of another format version."""


class NewerFormatError(EntryError):
    """An entry written by a newer build (a format version above this build's): unreadable
    here, valid for that build, so a miss that is never deleted."""


class AuthError(EntryError):
    """An entry that this store's keys do not authenticate: unsigned, forged, signed with a key
    this store does not accept, or whose payload its signed digests do not cover. A miss that
    is never used, promoted, deleted or overwritten (``slot.py``); ``retired``: signed with a
    retired key, so its entry may be overwritten."""

    def __init__(self, message: str, retired: bool = False) -> None:
        super().__init__(message)
        self.retired = retired
