"""One tier of a ``TieredKVStore`` with its health and counters: every operation on a tier goes
through its ``TierSlot``, which counts it and turns a failure into a miss.

What a failure leads to (docs/store.md, "What the store guarantees"):

- a storage failure (one of the tier's ``errors``) is a miss and counts against the *tier*:
  benched at once when the tier says it is unusable, else after repeated failures
  (``TierHealth``);
- an entry whose bytes fail a check (``EntryError``) is a miss, and it is deleted only when a
  fresh read of the stored bytes fails a check too (``judge``): what one read saw may have
  been changed in transit or replaced meanwhile, and a valid entry is never deleted for it;
- in a tier with keys (``Tier.authenticated``), an entry whose tag its keys do not accept over
  an intact header (``AuthError``: forged, unsigned, another deployment's) is a miss counted in
  ``auth_failures``, never deleted, and never overwritten by this process (it may be a valid
  entry under a key this process lacks), unless it was signed with a retired key. Damage (a
  truncated entry, a header that is not JSON or fails its checksum, a payload that fails its
  digest under an authentic header) is a plain ``EntryError``: dealt with as in any tier, so the
  damaged entry is deleted, reported missing and stored again by the next write.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from blendrag.store.codec import Entry
from blendrag.store.errors import AuthError, EntryError, NewerFormatError
from blendrag.store.health import TierHealth
from blendrag.store.layered import LayeredEntry, MemoryLayeredEntry
from blendrag.store.protocol import TierCounters
from blendrag.store.ram import held_bytes
from blendrag.store.tier import Tier

log = logging.getLogger("blendrag.store")

T = TypeVar("T")
REFUSED_KEYS = 1 << 16  # entries refused by authentication remembered (not overwritten)


class TierSlot:
    """``tier`` with its health (benched after failures for ``retry_after_s``) and counters:
    what ``TieredKVStore.tiers`` shows of each tier."""

    def __init__(self, tier: Tier, retry_after_s: float) -> None:
        self.tier = tier
        self.health = TierHealth(tier.label, retry_after_s)
        self.counters = TierCounters()
        self._refused: OrderedDict[str, None] = OrderedDict()

    def call(self, action: str, fn: Callable[[], T], default: T) -> T:
        """``fn()`` unless the tier is benched (then ``default``); a storage failure counts
        against the tier (``failed``) and returns ``default``."""
        if not self.health.available:
            return default
        try:
            return fn()
        except self.tier.errors as exc:
            self.failed(action, exc)
            return default

    def failed(self, action: str, exc: BaseException) -> None:
        """Count the storage failure ``exc`` of ``action``: the tier is benched at once when it
        failed to open or says it is unusable, else after repeated failures."""
        self.counters.add(errors=1)
        at_once = action == "open" or self.tier.unusable(exc)
        self.health.failed(action, exc, at_once=at_once)

    def delete(self, key: str) -> None:
        self.call("delete", lambda: self.tier.delete(key), None)

    def read(self, key: str) -> Entry | None:
        """The tier's whole entry for ``key``, counted; None for a miss, a failure or an entry
        whose bytes fail a check (deleted when a fresh read confirms it: ``judge``)."""
        t0 = time.perf_counter()
        found = self._guarded(key, t0, lambda: self.tier.read(key))
        if found is None:
            return None
        entry, size = found
        self.counters.add(hits=1, bytes_read=size, load_seconds=time.perf_counter() - t0)
        return entry

    def open_layers(self, key: str) -> LayeredEntry | None:
        """The tier's entry for ``key`` opened for layer-wise reads (its layers' bytes are
        counted as they are read: ``CountedLayeredEntry``); None as for ``read``."""
        t0 = time.perf_counter()
        # the header read alone clears no strike: only a layer read proves the values readable
        found = self._guarded(key, t0, lambda: self.tier.open_layers(key), clears=False)
        if found is None:
            return None
        held = held_bytes(found.kv) if isinstance(found, MemoryLayeredEntry) else 0
        self.counters.add(hits=1, bytes_read=held, load_seconds=time.perf_counter() - t0)
        return found

    def _guarded(self, key: str, t0: float, read: Callable[[], T | None],
                 clears: bool = True) -> T | None:
        """``read()``; a miss counted when it finds nothing, fails or the entry is defective;
        ``clears``: a success clears the tier's strikes."""
        if not self.health.available:
            return None
        try:
            found = read()
        except EntryError as exc:
            self.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
            self.judge(key, exc)
            return None
        except self.tier.errors as exc:
            self.failed("read", exc)
            self.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
            return None
        if clears:
            self.health.succeeded()
        if found is None:
            self.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
        return found

    def judge(self, key: str, exc: EntryError) -> None:
        """A read of ``key`` failed a check (``exc``): delete the entry when a fresh read of its
        stored bytes fails a check too; else leave it (a failure of the fresh read, or a valid
        fresh read, counts against the tier: the first read was not the stored bytes). An entry
        of a newer format version is valid for the build that wrote it: left alone. In a tier
        with keys, an entry that fails a check is not authenticated: counted, left alone and
        not overwritten (``refused``); a damaged one is dealt with as in any tier."""
        if isinstance(exc, AuthError):
            self._not_authenticated(key, exc)
            return
        self.counters.add(corrupt=1)
        if isinstance(exc, NewerFormatError):
            return
        try:
            fresh = self.tier.read(key)
        except AuthError as again:  # what the first read saw damaged is a forgery as stored
            self._not_authenticated(key, again, count=False)
            return
        except NewerFormatError:  # rewritten since by a newer build: valid for it, left alone
            return
        except EntryError as again:
            log.warning("KV store: %s entry %s is unusable (%s); treated as a miss and deleted",
                        self.tier.name, key[:16], again)
            self._refused.pop(key, None)  # stored again by the next write
            self.delete(key)
            return
        except self.tier.errors as failure:
            self.failed("read", failure)
            return
        if fresh is not None:  # kept: one warning, from the tier's health
            self.health.failed(f"read entry {key[:16]} as stored (a fresh read of it is valid, "
                               "so it is kept)", exc, at_once=False)

    def _not_authenticated(self, key: str, exc: AuthError, count: bool = True) -> None:
        """Count ``key``'s entry that ``exc`` says is not authenticated and leave it (refused:
        not overwritten, unless signed with a retired key)."""
        if count:
            self.counters.add(auth_failures=1)
        # said once per entry: a poisoned tier is read (and counted) at every request
        say = log.debug if key in self._refused else log.warning
        if not exc.retired:
            self._refuse(key)
        say("KV store: %s entry %s is not authenticated (%s): a miss, left as it is "
            "(said once per entry; counted in auth_failures)", self.tier.name, key[:16], exc)

    def refused(self, key: str) -> bool:
        """Whether ``key``'s stored entry failed authentication here (this process leaves it)."""
        return key in self._refused

    def _refuse(self, key: str) -> None:
        self._refused[key] = None
        self._refused.move_to_end(key)
        while len(self._refused) > REFUSED_KEYS:
            self._refused.popitem(last=False)

    def write(self, entry: Entry) -> bool:
        """Store ``entry``; False when the tier is benched, failed, the entry does not fit, or
        the tier holds an entry under its key that failed authentication (``refused``)."""
        if not self.health.available or entry.key in self._refused:
            return False
        try:
            stored = self.tier.write(entry)
        except self.tier.errors as exc:
            self.failed("write", exc)
            return False
        self.health.succeeded()
        if stored:
            self.counters.add(bytes_written=stored)
        else:
            log.debug("KV store: entry %s exceeds the %s budget; not stored", entry.key[:16],
                      self.tier.name)
        return bool(stored)
