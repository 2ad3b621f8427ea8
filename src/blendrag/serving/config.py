"""How a scheduler serves many requests at once (``ServingConfig``), checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from blendrag.checks import check_at_least
from blendrag.engine.compute.pieces import MIN_PIECE_TOKENS

DEFAULT_SLOT_TOKENS = 4096
"""Rows of a slab slot by default: a typical RAG prompt of about 3k tokens and its answer."""

DEFAULT_PIECE_TOKENS = 512
"""Tokens of a prefill piece on a CPU by default (chunked prefill)."""
DEFAULT_GPU_PIECE_TOKENS = 4096
"""Tokens of a prefill piece on a GPU by default: a typical RAG prompt runs whole (on an H200,
at a 7B model's shape, pieces of 512 made a served 3k-token prefill take about 5 times its
time alone)."""
DEFAULT_PACK_TOKENS = 4096
"""Computed tokens packed into one forward on a GPU by default: 16 requests' questions of 64
tokens and their recomputed chunk tokens at a typical prompt."""


@dataclass(frozen=True)
class ServingConfig:
    """Limits of one engine's scheduler (blendrag.serving.scheduler).

    max_seqs: requests decoding at once, one batched step for all of them.
    max_queue: requests waiting to start; one more is refused at once (``QueueFull``).
    prefill_workers: threads that prefill admitted requests beside the decoding loop (a new
      prompt's prefill then never stalls the running requests' next tokens: on a GPU their
      kernels interleave with the steps', on a CPU it takes another core); 0: prefills run in
      the decoding loop's thread between two steps. None: one on a GPU; on a CPU one when its
      cores hold the decoding loop's torch threads and the worker's (``threads`` each), else
      none: a second compute thread pays only with a core of its own (docs/benchmarks.md "Many
      users at once": 4 users on 2 vCPUs got 2.40x one-at-a-time's throughput over 32
      requests with a worker, 1.66x without; once, when the second vCPU did not compute,
      1.17x with one).
    max_prefill_tokens: with ``prefill_workers=0``, prompt tokens prefilled between two
      decoding steps (at least one request's whatever its length): requests that are decoding
      wait at most that long for their next token when new requests arrive.
    prefill_piece_tokens: a prefill computing more prompt tokens than this runs in pieces of
      this many (chunked prefill: engine/compute/pieces.py), so that a long prompt does not
      stall every running request's next token: between two pieces a prefill in the decoding
      loop's thread decodes a step for the running requests, and a prefill worker on a GPU
      waits for its piece, letting their steps in. 0: every prefill whole. None:
      ``DEFAULT_PIECE_TOKENS`` on a CPU; ``DEFAULT_GPU_PIECE_TOKENS`` on a GPU, where a piece
      of a 7B model's prefill shorter than a typical prompt is bound by its launches, not its
      arithmetic (docs/benchmarks.md "On a GPU").
    pack_tokens: the requests prefilled together (those admitted in one turn of the loop, or
      waiting for the prefill worker) have their passes packed into one forward
      (engine/request/packing.py) of at most this many computed tokens: reuse's question,
      blend's recomputed tokens, a prefix-cache tail, a short full prefill. 0: each runs alone.
      None: ``DEFAULT_PACK_TOKENS`` on a GPU, where such a pass is bound by reading the
      weights; 0 on a CPU, whose passes are bound by their arithmetic.
    pool_tokens: request KV rows all running requests may hold together (prompt + answer each,
      counted in blocks of ``block_tokens``); None: ``max_seqs`` requests of the model's longest
      context. A request that can never fit is refused (``PromptTooLarge``); one that cannot fit
      now waits for others to finish.
    slot_tokens: rows of each slot of the KV slab, where the running requests' KVs live side
      by side (engine/compute/slab.py), so that their decoding step attends in one call per
      layer and, on a GPU, is replayed from CUDA graphs: ``max_seqs`` slots and a scratch
      slot, made at the first request (``(max_seqs + 1) x slot_tokens`` rows of KV; a slot is
      zeroed when first used). A request whose prompt and answer need more rows takes a buffer
      of its own and decodes beside the slab's requests. 0: no slab, every request its own
      buffer (on a CPU 4 users got 2.42x one-at-a-time's throughput with the slab, 2.27x
      without: docs/benchmarks.md "Many users at once").
    timeout_s: a request not done within this many seconds of its arrival fails with
      ``RequestTimeout`` (None: no limit); ``submit`` may set its own.
    threads: torch's CPU threads of each of the scheduler's threads, decoding and prefilling
      (None: the engine's).
    idle_s: the scheduler's thread ends after this long without work (a new request starts it
      again).
    """

    max_seqs: int = 16
    max_queue: int = 256
    prefill_workers: int | None = None
    max_prefill_tokens: int = 8192
    prefill_piece_tokens: int | None = None
    pack_tokens: int | None = None
    pool_tokens: int | None = None
    block_tokens: int = 16
    slot_tokens: int = DEFAULT_SLOT_TOKENS
    timeout_s: float | None = None
    threads: int | None = None
    idle_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_seqs", "max_queue", "max_prefill_tokens", "block_tokens"):
            _count(name, getattr(self, name), 1)
        if self.prefill_workers is not None:
            _count("prefill_workers", self.prefill_workers, 0)
        if self.pack_tokens is not None:
            _count("pack_tokens", self.pack_tokens, 0)
        if self.pool_tokens is not None:
            _count("pool_tokens", self.pool_tokens, self.block_tokens)
        _count("slot_tokens", self.slot_tokens, 0)
        if self.prefill_piece_tokens not in (None, 0):
            _count("prefill_piece_tokens", self.prefill_piece_tokens, MIN_PIECE_TOKENS)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds or None, got {self.timeout_s!r}")
        if self.threads is not None:
            _count("threads", self.threads, 1)
        if not self.idle_s > 0:
            raise ValueError(f"idle_s must be > 0 seconds, got {self.idle_s!r}")


def _count(label: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label} must be an integer, got {value!r}")
    check_at_least(label, value, low)
