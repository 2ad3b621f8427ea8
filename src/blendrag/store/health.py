"""Graceful degradation: a tier that fails is benched for a while instead of failing requests.

Two kinds of failure (the tier says which: ``Tier.unusable``):

- a failure that says the tier itself cannot be used now (it cannot be opened, a refused or
  timed-out connection, a read-only or full filesystem, another process holding the lock past
  the timeout) benches it at once;
- a failure of one operation (descriptors exhausted, an I/O error, a permission on one file, a
  reply shorter than the value the server holds, a read that a fresh read contradicts) is a
  miss for that request and a *strike*: ``STRIKES`` in a row, with no success between, bench
  the tier. A success clears the strikes.

A benched tier is skipped for ``retry_after_s``, then used again; a failure of that first use
benches it again at once.
"""

from __future__ import annotations

import errno
import logging
import threading
import time

log = logging.getLogger("blendrag.store")

# Consecutive failed operations (no success between) that bench a tier.
STRIKES = 3

# errno values that say one operation failed, not that the tier is gone: the next operation
# may well succeed (another file, a descriptor freed, the I/O retried).
TRANSIENT_ERRNOS = frozenset({
    errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.EACCES, errno.EPERM,
    errno.EAGAIN, errno.EINTR, errno.EBUSY,
})


class TierUnavailable(OSError):
    """The tier as a whole cannot be used now (it failed to open): benches it at once."""


def transient_os_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an OSError that says one operation failed (``TRANSIENT_ERRNOS``)."""
    return (isinstance(exc, OSError) and not isinstance(exc, TierUnavailable)
            and exc.errno in TRANSIENT_ERRNOS)


class TierHealth:
    """Whether a tier may be used now, and its strikes (see the module docstring).

    Why a bench rather than a retry per call: a read-only or full disk and an unreachable Redis
    fail every call the same way; retrying each would add a timeout to every request and flood
    the log. Why strikes before benching a transient failure: one exhausted descriptor table or
    one short reply says little about the next call, and a bench costs every request the tier's
    hits for ``retry_after_s``.
    """

    def __init__(self, label: str, retry_after_s: float, strikes: int = STRIKES) -> None:
        if strikes < 1:
            raise ValueError(f"TierHealth strikes must be >= 1, got {strikes}")
        self.label = label
        self.retry_after_s = retry_after_s
        self.strikes = strikes
        self._down_until = 0.0
        self._failures = 0  # consecutive, since the last success
        self._lock = threading.Lock()
        self.last_error: str | None = None  # what the last failure was, for reports

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    @property
    def failures(self) -> int:
        """Consecutive failures since the last success."""
        return self._failures

    def retry_now(self) -> None:
        """End the bench now, as if ``retry_after_s`` had passed: the next use probes the tier,
        and a failure of it benches the tier again at once (an operator who fixed the tier;
        tests)."""
        self._down_until = 0.0

    def succeeded(self) -> None:
        """An operation on the tier worked: its strikes are cleared."""
        self._failures = 0

    def failed(self, action: str, exc: BaseException, *, at_once: bool = True) -> None:
        """Count a failure of ``action`` (``exc``); bench the tier, with one warning, when
        ``at_once`` or when this is the ``strikes``-th in a row."""
        with self._lock:
            self._failures += 1
            self.last_error = f"{self.label} failed to {action} ({type(exc).__name__}: {exc})"
            bench = at_once or self._failures >= self.strikes
            if bench:
                self._down_until = time.monotonic() + self.retry_after_s
                # the first failure after the bench benches again at once
                self._failures = max(self._failures, self.strikes)
            failures = self._failures
        if bench:
            log.warning("KV store: %s failed to %s (%s: %s); continuing without it for %.0f s",
                        self.label, action, type(exc).__name__, exc, self.retry_after_s)
        else:
            log.warning("KV store: %s failed to %s (%s: %s); a miss for this request (%d of %d "
                        "failures in a row before the tier is benched)", self.label, action,
                        type(exc).__name__, exc, failures, self.strikes)
