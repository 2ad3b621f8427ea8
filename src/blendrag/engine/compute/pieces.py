"""A long prefill in pieces, so that other requests decode between them (chunked prefill).

A served request's prefill that computes thousands of tokens (a full prefill, a long question
after cached rows) would stall every request decoding on the same model for as long as it
runs. Run in pieces instead: the computed tokens [a, n) in position order, ``tokens`` at a
time, each piece one run of the layer loop over the rows before it, and ``between()`` called
after every piece but the last (the scheduler decodes a step for the running requests there, or
gives the device to them).

Which passes split: those that compute one run of positions up to the prompt's end from layer 0
with every token kept (no blend selector, whose check layers choose among all the computed
tokens at once; no APE), watched by nothing but ``LayerCounts``. The cached rows before them
come with the first piece (its feed places them); a later piece reads them, and the rows the
pieces before it computed, as cached rows. Exactness: a piece's tokens attend over exactly the
keys they attend over in one pass (the causal mask at their positions); the attention is blocked
differently, which may round differently in the last bits (the tests bound the logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from blendrag.engine.compute.loop import LoopPlan, LoopResult
from blendrag.engine.compute.observers import LayerCounts, LayerObserver

MIN_PIECE_TOKENS = 16


@dataclass
class PrefillPieces:
    """Prefill in pieces of ``tokens`` computed tokens, ``between()`` after each but the last;
    ``between_s``: the seconds spent in it so far (one prefill's: make one per prefill)."""

    tokens: int
    between: Callable[[], None]
    between_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) \
                or self.tokens < MIN_PIECE_TOKENS:
            raise ValueError(f"a prefill piece must be an integer >= {MIN_PIECE_TOKENS} tokens, "
                             f"got {self.tokens!r}")

    def spans(self, plan: LoopPlan, observers: tuple[LayerObserver, ...]) -> list[slice] | None:
        """The pieces of ``plan`` as slices of its computed positions; None: it runs whole
        (short enough, or not a pass that splits: the module's docstring)."""
        computed = plan.active.shape[0]
        if computed <= self.tokens or plan.selector is not None or plan.ape is not None:
            return None
        if not all(isinstance(o, LayerCounts) for o in observers):
            return None
        n = plan.ids.shape[0]
        if int(plan.active[0]) != n - computed:  # sorted, unique, ends at n - 1: one run
            return None
        return [slice(s, min(s + self.tokens, computed)) for s in range(0, computed, self.tokens)]


def run_in_pieces(run: Callable[[LoopPlan, tuple[LayerObserver, ...]], LoopResult],
                  plan: LoopPlan, observers: tuple[LayerObserver, ...], pieces: PrefillPieces,
                  spans: list[slice]) -> LoopResult:
    """``plan`` run piece by piece with ``run(piece_plan, its_observers)``; the ``LayerCounts``
    among ``observers`` get each layer's counts summed over the pieces, as one pass gives
    them."""
    counts = [o for o in observers if isinstance(o, LayerCounts)]
    seen: list[tuple[LayerCounts, ...]] = []  # per piece, one fresh LayerCounts per caller's
    out: LoopResult | None = None
    for j, span in enumerate(spans):
        active = plan.active[span]  # [P] positions, in order
        end = span.stop + plan.ids.shape[0] - plan.active.shape[0]
        piece = LoopPlan(plan.ids[:end], active, feed=plan.feed if j == 0 else None)
        seen.append(tuple(LayerCounts(c.chunk_range) for c in counts))
        out = run(piece, seen[-1])
        if j < len(spans) - 1:
            t0 = time.perf_counter()
            pieces.between()
            pieces.between_s += time.perf_counter() - t0
    if out is None:
        raise ValueError("a prefill in pieces needs at least one piece")
    for c, pieces_of_c in zip(counts, zip(*seen)):  # per layer, summed over the pieces
        c.computed.extend(map(sum, zip(*(p.computed for p in pieces_of_c))))
        c.chunk_computed.extend(map(sum, zip(*(p.chunk_computed for p in pieces_of_c))))
        c.attended_keys.extend(map(sum, zip(*(p.attended_keys for p in pieces_of_c))))
    return out
