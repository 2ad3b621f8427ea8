"""The buckets of a static pass's shapes (engine/compute/static_pass.py): how many tokens it
computes and how many rows it attends over, each rounded up to one of a few sizes, so that a
few shapes (each a CUDA graph) serve every request."""

from __future__ import annotations

# computed tokens per pass: steps of 16 to 128, of 32 to 256, of 64 to 512, of 128 to 1,024
# and of 256 to 2,048 (SGLang's ladder is alike); a pass of more tokens is bound by its
# arithmetic, not by its launches
TOKEN_BUCKETS = (*range(16, 129, 16), *range(160, 257, 32), *range(320, 513, 64),
                 *range(640, 1025, 128), *range(1280, 2049, 256))


def token_bucket(tokens: int) -> int | None:
    """The token bucket of a pass computing ``tokens`` tokens (None: more than the largest)."""
    return next((b for b in TOKEN_BUCKETS if b >= tokens), None)


def ladder(rows: int) -> int:
    """``rows`` rounded up to a step of an eighth of the power of two below it (at least 16):
    at most 25 % more, four sizes an octave."""
    step = max(16, 1 << max(rows.bit_length() - 3, 0))
    return -(-rows // step) * step


def row_bucket(n: int, capacity: int) -> int | None:
    """The rows a pass over an ``n``-token prompt attends over, in a request KV of ``capacity``
    rows: ``ladder(n + 1)`` (a row past the prompt for the padded tokens), or the capacity
    when that passes it; None when no row is left past the prompt. A runner with static
    passes makes its request KVs ``ladder(capacity + 1)`` rows (``ModelRunner.buffer``), so
    that a request's bucket is never cut by its capacity and requests of similar lengths share
    one buffer size, and with it the captured passes over the pooled buffer."""
    if n < 1 or capacity <= n:
        return None
    return min(ladder(n + 1), capacity)
