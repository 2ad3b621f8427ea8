"""Where a request's time goes: wall time per phase of a prefill, for ``bench ttft``'s breakdown.

The layer loop calls ``clock.lap(phase)`` after each step; a lap charges the time since the
previous lap to ``phase``. On CUDA a timed request synchronizes at every lap (kernels are
asynchronous, so without it the time lands on whichever later step waits), which costs some
overlap: use timed requests for the breakdown and untimed ones for TTFT. Untimed requests get
``OFF``, whose laps do nothing.
"""

from __future__ import annotations

import time

import torch

from blendrag.engine.compute.observers import LayerObserver

PHASES = (
    "fetch",      # store lookups (+ computing missing chunk KVs)
    "setup",      # the request's KV buffer and RoPE table
    "plan",       # the selector's static choice, the preview pass excluded
    "preview",    # the preview selector's pass over the suffix
    "load",       # cached rows copied into the request's KV (values, pre-RoPE keys)
    "rotate",     # cached keys rotated to their positions in this request
    "project",    # norm, q/k/v projections and RoPE of the computed tokens
    "select",     # a scoring selector's check layers
    "write",      # fresh k/v rows written into the request's KV
    "attention",  # attention of the computed tokens over the request's KV
    "mlp",        # o_proj, residuals, norm, MLP
    "logits",     # final norm and lm_head of the last token
)


class PhaseClock(LayerObserver):
    """Seconds per phase (``seconds``), accumulated over laps. Pass one among a request's
    observers (``BlendEngine.prefill(..., observers=[PhaseClock(engine.device)])``) to time it."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def restart(self) -> None:
        """Start the next lap now (time since the last lap is charged to nothing)."""
        self._sync()
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap to ``phase``."""
        self._sync()
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


class _Off(PhaseClock):
    """The clock of untimed requests: laps cost one method call."""

    def __init__(self) -> None:
        self.seconds = {}

    def restart(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass


OFF: PhaseClock = _Off()
