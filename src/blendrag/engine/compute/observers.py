"""What callers learn from the layer loop, layer by layer: ``LayerObserver``s watch every layer
of a run (``loop.run_layers``) and never change what it computes.

- ``LayerCounts``: tokens computed, chunk tokens among them and keys attended per layer (the
  request's stats; what the compute and the FLOPs are counted from);
- ``CapturedRows``: the pre-RoPE keys and the values of the computed tokens (a chunk's rows,
  when a chunk is computed for the store);
- ``KeyAttention``: the attention the computed tokens pay a range of keys (the preview pass:
  where the question looks);
- ``Trace``: positions and queries of every layer (debugging, the evaluation's attention
  analysis): pass one to ``BlendEngine.prefill(..., observers=...)``;
- ``PhaseClock``: wall time per phase of a prefill (``bench ttft``'s breakdown). The loop calls
  ``clock.lap(phase)`` after each step; a lap charges the time since the previous lap to
  ``phase``. On CUDA a timed request synchronizes at every lap (kernels are asynchronous, so
  without it the time lands on whichever later step waits), which costs some overlap: use timed
  requests for the breakdown and untimed ones for TTFT. Untimed requests get ``OFF``, whose
  laps do nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerStep:
    """Layer ``layer`` once computed.

    pos: [A] positions computed at this layer (after a check layer's choice); q: [H, A, D] their
    rotated queries. projected: [P] positions projected at this layer (before the choice), with
    k_pre: [Hkv, P, D] their pre-RoPE keys and v: [Hkv, P, D] their values.
    attended_keys: keys the A tokens attended to (causal, windowed); per_key: [N] float32, the
    attention they paid each key, summed over heads and queries (only when an observer asks for
    ``scores``)."""

    layer: int
    pos: torch.Tensor
    q: torch.Tensor
    projected: torch.Tensor
    k_pre: torch.Tensor
    v: torch.Tensor
    attended_keys: int
    per_key: torch.Tensor | None


class LayerObserver:
    """Sees each layer of a run. ``scores``: the run computes the attention probabilities
    explicitly (in float32) so that ``LayerStep.per_key`` is set: the same output, another
    kernel (for the few queries of a preview pass)."""

    scores: bool = False

    def on_layer(self, step: LayerStep) -> None:
        """Called once per layer, in order, after the layer is computed."""


class LayerCounts(LayerObserver):
    """Per layer: tokens computed (``computed``), those inside ``chunk_range`` ([start, end) of
    the chunk tokens: blend's recompute, ``chunk_computed``) and the keys they attended to
    (attention work, ``attended_keys``).

    A static pass's counts (``count_pass``) are computed on the device and read back when they
    are first read, after the request's last sync: a read right after the pass would have
    the host wait for it before it queues what follows (the logits)."""

    def __init__(self, chunk_range: tuple[int, int]) -> None:
        self.chunk_range = chunk_range
        self._computed: list[int] = []
        self._chunk_computed: list[int] = []
        self._attended_keys: list[int] = []
        self._last: tuple[torch.Tensor, int] | None = None
        # static passes not read back yet: (their counts on the device, the windows, tokens)
        self._pending: list[tuple[torch.Tensor, list[int | None], Sequence[int | None],
                                  int]] = []

    @property
    def computed(self) -> list[int]:
        self._read_back()
        return self._computed

    @property
    def chunk_computed(self) -> list[int]:
        self._read_back()
        return self._chunk_computed

    @property
    def attended_keys(self) -> list[int]:
        self._read_back()
        return self._attended_keys

    def on_layer(self, step: LayerStep) -> None:
        self._read_back()  # in layer order
        if self._last is None or self._last[0] is not step.pos:  # the set changed
            lo, hi = self.chunk_range
            self._last = step.pos, int(((step.pos >= lo) & (step.pos < hi)).sum())
        self._computed.append(int(step.pos.shape[0]))
        self._chunk_computed.append(self._last[1])
        self._attended_keys.append(step.attended_keys)

    def count_pass(self, pos: torch.Tensor, windows: Sequence[int | None]) -> None:
        """Every layer computed the tokens at ``pos`` [A] (a pass no selector shrank:
        engine/compute/static_pass.py), layer i with the sliding window ``windows[i]``: the
        counts ``on_layer`` would take, on the device until they are read."""
        lo, hi = self.chunk_range
        kinds = list(dict.fromkeys(windows))
        seen = [(pos + 1) if w is None else (pos + 1).clamp(max=w) for w in kinds]
        # [1 + kinds]: the chunk tokens among them, then the keys attended per kind of window
        counts = torch.stack([((pos >= lo) & (pos < hi)).sum(), *(s.sum() for s in seen)])
        self._pending.append((counts, kinds, windows, int(pos.shape[0])))

    def _read_back(self) -> None:
        """The static passes' counts, read from the device into the lists, in order."""
        for counts, kinds, windows, tokens in self._pending:
            inside, *keys = counts.tolist()
            attended = dict(zip(kinds, keys))
            self._computed.extend(tokens for _ in windows)
            self._chunk_computed.extend(int(inside) for _ in windows)
            self._attended_keys.extend(int(attended[w]) for w in windows)
        self._pending.clear()


class CapturedRows(LayerObserver):
    """The pre-RoPE keys and values of the tokens projected at every layer:
    ``keys``, ``values``: [layers, Hkv, P, D] once the run is over."""

    def __init__(self) -> None:
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []

    def on_layer(self, step: LayerStep) -> None:
        self._keys.append(step.k_pre)
        self._values.append(step.v)

    @property
    def keys(self) -> torch.Tensor:
        return torch.stack(self._keys)

    @property
    def values(self) -> torch.Tensor:
        return torch.stack(self._values)


class KeyAttention(LayerObserver):
    """The attention the computed tokens pay keys [start, end), per layer, summed over heads and
    queries: ``attention``: [layers, end - start] float32 once the run is over."""

    scores = True

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self._rows: list[torch.Tensor] = []

    def on_layer(self, step: LayerStep) -> None:
        if step.per_key is None:
            raise ValueError("KeyAttention needs a run that computes the scores")
        self._rows.append(step.per_key)  # [N]: cut once, at the end

    def take_pass(self, per_key: torch.Tensor) -> None:
        """Every layer's attention per key at once, [layers, N] float32 (a static pass:
        engine/compute/static_pass.py)."""
        self._rows = list(per_key)

    @property
    def attention(self) -> torch.Tensor:
        return torch.stack(self._rows)[:, self.start:self.end]


class Trace(LayerObserver):
    """``layers[i]``: ``{"layer", "pos", "q"}`` of layer i (copies): which tokens were computed
    there and their queries."""

    def __init__(self) -> None:
        self.layers: list[dict] = []

    def on_layer(self, step: LayerStep) -> None:
        self.layers.append({"layer": step.layer, "pos": step.pos.clone(), "q": step.q.clone()})


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
        if self.cuda:  # this thread's stream: see request/prefill.py ``_sync``
            torch.cuda.current_stream(self.device).synchronize()


class _Off(PhaseClock):
    """The clock of untimed requests: laps cost one method call."""

    def __init__(self) -> None:
        self.seconds = {}

    def restart(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass


OFF: PhaseClock = _Off()
