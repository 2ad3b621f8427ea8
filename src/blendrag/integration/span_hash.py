"""Hashes of every span of a string in O(1) each, after one O(n) vectorised pass.

A string's code points ``c`` give prefix sums ``Q[k] = sum_{j<k} c[j] * B^-j`` (mod 2^64, numpy's
wrapping uint64 arithmetic; ``B`` odd, so invertible mod 2^64). The hash of the span
``[i, i + n)`` is ``(Q[i + n] - Q[i]) * B^i = sum_{t<n} c[i + t] * B^-t``: it does not depend on
where the span sits, so a text hashed alone and the same text inside a prompt hash alike.
Numpy computes ``Q`` and all windows of one length at once; a single span is then two array
reads and a multiply.

A 64-bit polynomial hash is not collision-proof against crafted input; what uses these hashes
(``ChunkTextIndex``) only ever cuts a prompt at a matched span, so a collision misplaces a cut
(a chunk-KV miss), never puts foreign text or a foreign KV into a request.
"""

from __future__ import annotations

import threading

import numpy as np

MASK = (1 << 64) - 1
BASE = 0x9E3779B97F4A7C15 | 1
BASE_INV = pow(BASE, -1, 1 << 64)
_LENGTH_MIX = 0xC2B2AE3D27D4EB4F


class _Powers:
    """``B^i`` and ``B^-i`` for i < capacity, grown by doubling (shared, read-mostly)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.up = self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        up, down = self.up, self.down  # one consistent pair, even while another thread grows
        if len(up) >= n:
            return up, down
        with self._lock:
            size = max(n, 2 * len(self.up), 1024)
            with np.errstate(over="ignore"):
                up = np.cumprod(np.full(size, BASE, dtype=np.uint64), dtype=np.uint64)
                down = np.cumprod(np.full(size, BASE_INV, dtype=np.uint64), dtype=np.uint64)
            one = np.ones(1, dtype=np.uint64)
            self.up, self.down = np.concatenate([one, up[:-1]]), np.concatenate([one, down[:-1]])
            return self.up, self.down


_POWERS = _Powers()


def codes(text: str) -> np.ndarray:
    """Code points of ``text`` (+1, so that NUL counts) as uint64; lone surrogates allowed."""
    raw = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return raw.astype(np.uint64) + np.uint64(1)


class SpanHasher:
    """Span hashes of one string (a prompt, or many texts concatenated)."""

    def __init__(self, text: str) -> None:
        c = codes(text)
        self.n = len(c)
        self._up, down = _POWERS.get(self.n + 1)
        q = np.zeros(self.n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            np.cumsum(c * down[:self.n], dtype=np.uint64, out=q[1:])
        self._q = q

    def windows(self, length: int) -> np.ndarray:
        """Hash of every span of ``length``: element i is the span starting at i."""
        if length > self.n:
            return np.zeros(0, dtype=np.uint64)
        q = self._q
        with np.errstate(over="ignore"):
            return (q[length:] - q[:-length]) * self._up[:self.n - length + 1]

    def spans(self, starts: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
        """Hashes of the spans ``[starts, starts + lengths)`` (arrays, or one length)."""
        q = self._q
        with np.errstate(over="ignore"):
            return (q[starts + lengths] - q[starts]) * self._up[starts]

    def span(self, start: int, length: int) -> int:
        """Hash of one span, as a Python int."""
        q = self._q
        return ((int(q[start + length]) - int(q[start])) * int(self._up[start])) & MASK


def with_length(span_hash: int, length: int) -> int:
    """A span's key: its hash mixed with its length (spans of different lengths never share a
    key unless the hashes collide)."""
    return (span_hash ^ (length * _LENGTH_MIX)) & MASK


def with_lengths(span_hashes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``with_length`` over arrays."""
    with np.errstate(over="ignore"):
        return span_hashes ^ (lengths.astype(np.uint64) * np.uint64(_LENGTH_MIX))


def text_hash(text: str) -> int:
    """Hash of a whole text (the hash of that span inside any string that holds it)."""
    return SpanHasher(text).span(0, len(text)) if text else 0
