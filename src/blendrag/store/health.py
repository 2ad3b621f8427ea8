"""Graceful degradation: a tier that fails is benched for a while instead of failing requests."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("blendrag.store")


class TierHealth:
    """Whether a tier may be used now. A failure benches it for ``retry_after_s`` seconds.

    Why a bench rather than a retry per call: a read-only or full disk and an unreachable Redis
    fail every call the same way; retrying each would add a timeout to every request and flood
    the log. One warning per failure, then the other tiers serve until the bench expires.
    """

    def __init__(self, label: str, retry_after_s: float) -> None:
        self.label = label
        self.retry_after_s = retry_after_s
        self._down_until = 0.0
        self.last_error: str | None = None  # what the last failure was, for reports

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, action: str, exc: BaseException) -> None:
        """Bench the tier after ``exc`` raised while doing ``action``, with one warning."""
        self._down_until = time.monotonic() + self.retry_after_s
        self.last_error = f"{self.label} failed to {action} ({type(exc).__name__}: {exc})"
        log.warning(
            "KV store: %s failed to %s (%s: %s); continuing without it for %.0f s",
            self.label, action, type(exc).__name__, exc, self.retry_after_s,
        )
