"""The loading controller (CacheBlend §5): which recompute ratio, and which storage tier.

With pipelined loading (``engine/compute/layer_feed.py``) a blend request takes about
``layers x max(load per layer, compute per layer)``. Loading a layer costs the same whatever
the ratio; recomputing a layer grows with it. So when loading is the bottleneck, recomputing
more is free up to the point where compute catches up with the load, and more recompute is
more quality. The controller answers two questions from measured speeds:

- ``choose_ratio``: per request, the largest ratio whose per-layer compute stays under
  ``margin`` x the per-layer load, clamped to [floor, cap]; the floor is the configured ratio
  (the quality the user asked for), the cap bounds the cost when loading is very slow.
- ``choose_tier``: for ``blendrag cache plan``, the cheapest tier whose per-layer load of a
  given prompt still hides under its per-layer compute (TTFT at the compute bound).

A layer's compute is modelled as ``token_s x computed tokens`` (ratio x chunk tokens plus
the suffix), a layer's load as what the background reader does for it: reading each tier's
bytes (``latency + bytes / bandwidth``) and placing the rows (``fixed_row_s x cached rows``:
copying the values and rotating the keys into the request's KV). ``LoadingController`` keeps
exponential moving averages of the measured figures: seconds per byte per tier (from the
layer feed's reads), seconds per placed row and seconds per computed token (the loop's time
less its waits).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blendrag.checks import check_at_least, is_finite_number
from blendrag.engine.caches.history import HISTORY_TAG
from blendrag.engine.request.stats import RatioDecision

if TYPE_CHECKING:
    from blendrag.config import BlendConfig
    from blendrag.engine.compute.fused_kv import CachedSegment
    from blendrag.engine.compute.layer_feed import LayerFeed
    from blendrag.engine.request.stats import RequestStats


@dataclass(frozen=True)
class LoadingConfig:
    """How an engine loads cached rows and how its controller chooses.

    prefetch_layers: layers the background reader may be ahead of the loop (0: sequential
      loading, each layer read when the loop needs it).
    auto_cap: the largest ratio ``ratio="auto"`` may choose.
    margin: aim the recompute of a layer at this fraction of its load (timing noise would
      otherwise make the loop wait now and then).
    min_step: recompute above the floor only when the load leaves room for at least this much
      more ratio. The estimates are averages over earlier requests, off by some percent for the
      request at hand on a shared CPU: with load and compute level, a step of a point or two
      buys no measurable quality and risks the TTFT (docs/architecture.md, "The controller").
    ema: weight of a request's measurement in the moving averages.
    full_when_faster: run a request as a full prefill (exact) when this device's cost profile
      (engine/selection/costs.py, measured at first use) predicts that its mode would be slower
      (short
      prompts, many missing chunks); None: on CUDA devices only (on a CPU the profile costs
      seconds and cached modes were faster at every size measured).
    full_when_missing: a request whose chunk tokens are in no store at this share or more
      runs as a full prefill (exact, and faster than computing its chunks first) and its
      missing chunks are computed and stored off its path, for the next request
      (engine/caches/backfill.py); 0.5 (the default: the first question on new documents
      never waits on ingestion, 1.04x a full prefill's TTFT against 2.84x computing them
      first, docs/benchmarks.md); None: missing chunks are computed first, in the request
      (what a benchmark of blend over freshly computed chunks measures).
    device_tier_bytes: keep hot chunk KVs in the model's device memory, at most this many
      bytes (engine/caches/device_tier.py: a hit copies nothing from the host); None: half of
      the device memory free after the model and a request buffer of the model's context on
      CUDA, 0 (off) on a CPU, whose RAM tier is that memory already.
    """

    prefetch_layers: int = 4
    auto_cap: float = 0.5
    margin: float = 0.9
    min_step: float = 0.05
    ema: float = 0.5
    full_when_faster: bool | None = None
    device_tier_bytes: int | None = None
    full_when_missing: float | None = 0.5

    def __post_init__(self) -> None:
        if self.full_when_missing is not None and not (
                is_finite_number(self.full_when_missing) and 0 < self.full_when_missing <= 1):
            raise ValueError(f"full_when_missing must be None or in (0, 1], got "
                             f"{self.full_when_missing!r}")
        if self.device_tier_bytes is not None and (
                isinstance(self.device_tier_bytes, bool)
                or not isinstance(self.device_tier_bytes, int) or self.device_tier_bytes < 0):
            raise ValueError(f"device_tier_bytes must be None or an int >= 0, got "
                             f"{self.device_tier_bytes!r}")
        if isinstance(self.prefetch_layers, bool) or not isinstance(self.prefetch_layers, int) \
                or self.prefetch_layers < 0:
            raise ValueError(f"prefetch_layers must be an int >= 0, got {self.prefetch_layers!r}")
        for name in ("auto_cap", "margin", "ema"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if not (is_finite_number(self.min_step) and 0 <= self.min_step < 1):
            raise ValueError(f"min_step must be in [0, 1), got {self.min_step!r}")
        if self.full_when_faster not in (None, True, False):
            raise ValueError(f"full_when_faster must be None, True or False, got "
                             f"{self.full_when_faster!r}")


@dataclass(frozen=True)
class RatioChoice:
    ratio: float
    reason: str  # "load-bound", "load-bound: capped", "compute-bound: floor", ...


def layer_compute_s(ratio: float, chunk_tokens: int, other_tokens: int,
                    token_s: float) -> float:
    """Modelled compute of one layer: the computed tokens."""
    return token_s * (ratio * chunk_tokens + other_tokens)


def choose_ratio(load_layer_s: float, chunk_tokens: int, other_tokens: int, token_s: float,
                 floor: float, cap: float, margin: float = 0.9,
                 min_step: float = 0.0) -> RatioChoice:
    """The largest ratio in [floor, cap] whose modelled layer compute is at most
    ``margin x load_layer_s`` (rounded down to 0.001); the floor when even it does not hide,
    or when it exceeds the floor by less than ``min_step`` (within the estimates' error)."""
    cap = max(cap, floor)
    if chunk_tokens <= 0 or token_s <= 0:
        return RatioChoice(floor, "no chunk tokens to recompute" if chunk_tokens <= 0
                           else "no compute estimate")
    budget = margin * load_layer_s - layer_compute_s(0.0, chunk_tokens, other_tokens, token_s)
    ratio = math.floor(1000 * budget / (token_s * chunk_tokens)) / 1000
    if ratio <= floor:
        return RatioChoice(floor, "compute-bound: floor")
    if ratio < floor + min_step and ratio < cap:
        return RatioChoice(floor, "load about level with compute: floor")
    if ratio >= cap:
        return RatioChoice(cap, "load-bound: capped")
    return RatioChoice(ratio, "load-bound")


@dataclass(frozen=True)
class TierModel:
    """A storage tier as the planner sees it: its name, read bandwidth (GB/s) and latency per
    request (us). Tiers are given cheapest first."""

    name: str
    bandwidth_gbps: float
    latency_us: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        check_at_least(f"tier {self.name}: bandwidth (GB/s)", self.bandwidth_gbps, strict=True)
        check_at_least(f"tier {self.name}: latency (us)", self.latency_us)

    def layer_load_s(self, layer_bytes: int, requests: int) -> float:
        """One layer of a prompt: ``requests`` reads (one per cached entry) of ``layer_bytes``
        in all."""
        return requests * self.latency_us * 1e-6 + layer_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class TierVerdict:
    tier: str
    load_layer_s: float
    compute_layer_s: float
    ttft_s: float  # layers x max(load, compute) per layer: the pipelined estimate
    compute_bound: bool


def choose_tier(tiers: list[TierModel], layers: int, layer_bytes: int, entries: int,
                compute_layer_s: float) -> tuple[str | None, list[TierVerdict]]:
    """The cheapest tier (the first in ``tiers``) whose per-layer load hides under
    ``compute_layer_s``, None when none does; and every tier's figures."""
    verdicts = []
    for t in tiers:
        load = t.layer_load_s(layer_bytes, entries)
        verdicts.append(TierVerdict(t.name, load, compute_layer_s,
                                    layers * max(load, compute_layer_s), load <= compute_layer_s))
    best = next((v.tier for v in verdicts if v.compute_bound), None)
    return best, verdicts


class LoadingController:
    """Moving averages of the measured load and compute speeds, and the per-request choice."""

    def __init__(self, config: LoadingConfig | None = None) -> None:
        self.config = config or LoadingConfig()
        self._lock = threading.Lock()
        self.s_per_byte: dict[str, float] = {}  # per tier
        self.token_s: float | None = None  # seconds per computed token and layer
        self.fixed_row_s: float | None = None  # seconds per cached row and layer (copy, rotate)

    def observe(self, tier_s: dict[str, float], tier_bytes: dict[str, int], compute_s: float,
                token_layers: int, place_s: float, cached_row_layers: int) -> None:
        """Fold in one request: reading time and bytes per tier; the loop's compute (its time
        less its waits) over the token-layers it computed; the time placing cached rows (copy
        and rotation) over the row-layers placed."""
        with self._lock:
            for tier, seconds in tier_s.items():
                if tier_bytes.get(tier):
                    self.s_per_byte[tier] = self._avg(self.s_per_byte.get(tier),
                                                      seconds / tier_bytes[tier])
            if cached_row_layers:
                self.fixed_row_s = self._avg(self.fixed_row_s, place_s / cached_row_layers)
            if token_layers:
                self.token_s = self._avg(self.token_s, max(compute_s, 0.0) / token_layers)

    def _avg(self, old: float | None, new: float) -> float:
        a = self.config.ema
        return new if old is None else (1 - a) * old + a * new

    def decide(self, layer_bytes_per_tier: dict[str, int], chunk_tokens: int, other_tokens: int,
               cached_rows: int, floor: float) -> tuple[float, RatioDecision]:
        """The ratio for a pipelined request whose cached rows come from the tiers in
        ``layer_bytes_per_tier`` (bytes of one layer from each), and the decision's record."""
        c = self.config
        with self._lock:
            unknown = [t for t in layer_bytes_per_tier if t not in self.s_per_byte]
            load = sum(self.s_per_byte.get(t, 0.0) * b for t, b in layer_bytes_per_tier.items())
            token_s, fixed = self.token_s, self.fixed_row_s
        info = RatioDecision(floor, "", floor, c.auto_cap, load, token_s, fixed,
                             tiers=sorted(layer_bytes_per_tier))
        if unknown or token_s is None or fixed is None:
            missing = ", ".join(unknown) or "compute"
            choice = RatioChoice(floor, f"no estimate yet ({missing}): floor")
        else:
            load += fixed * cached_rows  # the reader places each layer's rows too
            info.load_layer_s = load
            choice = choose_ratio(load, chunk_tokens, other_tokens, token_s, floor, c.auto_cap,
                                  c.margin, c.min_step)
            info.compute_layer_s = layer_compute_s(choice.ratio, chunk_tokens, other_tokens,
                                                   token_s)
        info.ratio, info.reason = choice.ratio, choice.reason
        return choice.ratio, info


def decide(controller: LoadingController, config: BlendConfig, cached: list[CachedSegment],
           feed: LayerFeed, stats: RequestStats) -> tuple[float, RatioDecision]:
    """The ratio of an auto-ratio request, and its record (``stats.controller.ratio``).

    Only a pipelined request whose blend pass reads the layers can hide recompute under
    loading: with sequential loading nothing overlaps, rows read already into page-locked
    memory are all sent before a captured pass runs, and the ``preview`` selector's preview
    pass reads every layer before the blend pass starts (it needs all of them to choose), so
    these keep the floor."""
    floor = float(config.ratio)
    why = _kept_floor(feed, config)
    if why is not None:
        return floor, RatioDecision(floor, why, floor)
    per_tier: dict[str, int] = {}
    for seg in cached:
        tier = seg.kv.tier
        if tier not in ("computed", HISTORY_TAG):  # in memory already: nothing to load
            per_tier[tier] = per_tier.get(tier, 0) + seg.kv.layer_nbytes
    return controller.decide(per_tier, stats.prompt.chunk_tokens, stats.prompt.suffix_tokens,
                             sum(s.kv.num_tokens for s in cached), floor)


def _kept_floor(feed: LayerFeed, config: BlendConfig) -> str | None:
    """Why an auto-ratio request keeps its floor (``decide``'s docstring), or None."""
    if feed.resident:
        return "every cached row on the device already: nothing to hide recompute under"
    if not feed.pipelined:
        return "sequential loading: nothing to hide recompute under"
    if feed.loaded:
        return ("every cached row read already (page-locked: a captured pass sends them all "
                "before it runs): nothing to hide recompute under")
    if config.selector == "preview":
        return "preview: its preview pass reads every layer before the blend pass"
    return None


def observe(controller: LoadingController, feed: LayerFeed, stats: RequestStats) -> None:
    """Fill the request's loading figures in ``stats`` and fold them into ``controller``."""
    loading, compute = stats.loading, stats.compute
    loading.pipelined = feed.pipelined
    loading.placed_ahead = feed.place_ahead
    loading.load_s = sum(feed.tier_s.values())
    loading.load_wait_s = feed.wait_s
    loading.place_s = feed.place_s
    # the loop's waits hold whatever loading ran on its thread (reads and placing), the
    # other requests' steps run between the pieces of a prefill in pieces, and the others
    # prefilled with it up to their main passes
    loading.compute_s = max(stats.timing.prefill_s - feed.wait_s
                            - stats.timing.between_pieces_s - stats.timing.waited_s, 0.0)
    # The compute speed is learnt from the requests whose computed tokens are like those a
    # ratio adds (scattered tokens attending over cached rows): a full or prefix prefill
    # computes causal blocks, cheaper per token, which would make the controller overshoot;
    # and from a main pass run alone (a packed one's time is shared with other requests) at
    # its steady state (not one whose shape is being captured).
    token_layers = 0
    if stats.mode in ("blend", "reuse") and compute.packed_requests == 1 \
            and not compute.warming_passes:
        token_layers = sum(compute.computed_per_layer) + compute.preview_tokens * compute.layers
    controller.observe(feed.tier_s, feed.tier_bytes, loading.compute_s, token_layers,
                       feed.place_s, stats.cache.tokens_reused * compute.layers)
