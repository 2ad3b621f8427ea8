"""What callers learn from the layer loop, layer by layer: ``LayerObserver``s watch every layer
of a run (``loop.run_layers``) and never change what it computes.

- ``LayerCounts``: tokens computed, chunk tokens among them and keys attended per layer (the
  request's stats; what the compute and the FLOPs are counted from);
- ``CapturedRows``: the pre-RoPE keys and the values of the computed tokens (a chunk's rows,
  when a chunk is computed for the store);
- ``KeyAttention``: the attention the computed tokens pay a range of keys (the preview pass:
  where the question looks);
- ``Trace``: positions and queries of every layer (debugging, the evaluation's attention
  analysis): pass one to ``BlendEngine.prefill(..., observers=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class LayerCounts(LayerObserver):
    """Per layer: tokens computed, those inside ``chunk_range`` ([start, end) of the chunk
    tokens: blend's recompute) and the keys they attended to (attention work)."""

    chunk_range: tuple[int, int]
    computed: list[int] = field(default_factory=list)
    chunk_computed: list[int] = field(default_factory=list)
    attended_keys: list[int] = field(default_factory=list)
    _last: tuple[torch.Tensor, int] | None = field(default=None, repr=False)

    def on_layer(self, step: LayerStep) -> None:
        if self._last is None or self._last[0] is not step.pos:  # the set changed
            lo, hi = self.chunk_range
            self._last = step.pos, int(((step.pos >= lo) & (step.pos < hi)).sum())
        self.computed.append(int(step.pos.shape[0]))
        self.chunk_computed.append(self._last[1])
        self.attended_keys.append(step.attended_keys)


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
