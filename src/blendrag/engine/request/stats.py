"""What one request did and how long it took, grouped by what each part describes; ``to_dict``
gives one flat JSON-able dict (every field name is unique across the groups).

The store's share (``CacheStats.store``) is the request's own: the engine hands each request
its store through a ``RequestStore`` (engine/request/request_store.py), which counts that
request's own lookups and reads, never another request's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from blendrag.config import BlendConfig
from blendrag.prompt import PromptLayout


@dataclass
class PromptStats:
    """The prompt's shape: tokens in all and per piece, and the number of chunks."""

    tokens: int = 0
    prefix_tokens: int = 0
    chunk_tokens: int = 0
    suffix_tokens: int = 0
    chunks: int = 0


@dataclass
class CacheStats:
    """Where the cached rows came from.

    chunk_hits / chunk_misses: chunks found in the store / computed now (every chunk of the
    layout: a framework's separators between passages are chunks too); hit_chunks: the
    indices, in the layout, of the chunks found in the store; prefix_hit: the
    prefix's rows found; exact_first: the first passage's rows were its exact ones
    (``ChunkContext.exact_first``); prefix_cache_tokens: rows taken from the prefix cache (an
    earlier request that began the same way), prefix_cache_exact: whether all of them were
    exact (None: none taken); history_tokens: rows of earlier turns taken from the history
    cache, wherever they landed in this prompt (engine/caches/history.py; the layout's last chunk);
    tokens_reused: rows taken from any cache; profiles_computed:
    chunk profiles measured by this request (``profile`` selector, first use);
    chunks_without_context: chunks too long for the ingestion context, whose rows were
    computed after the chunk prefix alone; load_retries: attempts redone because cached entries
    failed to load midway (those chunks recomputed); store: what this request did to the store
    (``StoreStats.since(before).to_dict()``); device_hits: entries (chunks and the prefix)
    served from the device tier (engine/caches/device_tier.py), no host copy; backfilled:
    pieces (the prefix, chunks) in no store that this request, run as a full prefill, queued
    to be computed off its path (engine/caches/backfill.py)."""

    chunk_hits: int = 0
    chunk_misses: int = 0
    hit_chunks: list[int] = field(default_factory=list)
    prefix_hit: bool = False
    exact_first: bool = False
    prefix_cache_tokens: int = 0
    prefix_cache_exact: bool | None = None
    history_tokens: int = 0
    tokens_reused: int = 0
    profiles_computed: int = 0
    chunks_without_context: int = 0
    load_retries: int = 0
    store: dict | None = None
    device_hits: int = 0
    backfilled: int = 0


@dataclass
class ComputeStats:
    """What the request computed, per layer.

    computed_per_layer[i]: tokens whose layer i was computed (the suffix included);
    recomputed_chunk_tokens_per_layer[i]: of those, chunk tokens (blend's recompute);
    attended_keys_per_layer[i]: keys they attended to (attention work); preview_tokens and
    preview_attended_keys: the preview pass's tokens (at every layer) and keys (all layers);
    bridged_tokens: tokens computed (at every layer) after the prefix cache's rows to the end
    of the piece those rows stop in (engine/request/head.py); packed_requests: the requests
    whose main passes ran in one forward with its own, itself included (1: alone;
    engine/request/packing.py); warming_passes: its passes whose shape was seen for the first
    time or captured now (``LoopResult.warming``: its time is no steady-state one)."""

    layers: int = 0
    computed_per_layer: list[int] = field(default_factory=list)
    recomputed_chunk_tokens_per_layer: list[int] = field(default_factory=list)
    attended_keys_per_layer: list[int] = field(default_factory=list)
    preview_tokens: int = 0
    preview_attended_keys: int = 0
    bridged_tokens: int = 0
    packed_requests: int = 1
    warming_passes: int = 0


@dataclass
class TimingStats:
    """Seconds. match_s: a framework LLM finding the chunks in a flat prompt and tokenizing its
    pieces; fetch_s: opening the cached rows (computing missing chunks included); prefill_s:
    the layer loop and the logits; ttft_s: from the request's start to the first token's
    logits (all of the above); between_pieces_s: the part of prefill_s a prefill run in pieces
    left to other requests between two (engine/compute/pieces.py); waited_s: the part of
    prefill_s it waited, stopped at its passes, for the requests prefilled with it to reach
    theirs (engine/request/packing.py)."""

    match_s: float = 0.0
    fetch_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    between_pieces_s: float = 0.0
    waited_s: float = 0.0

    @property
    def work_s(self) -> float:
        """The request's own work: opening its rows and its prefill, less what it left to the
        requests served beside it (``between_pieces_s``, ``waited_s``). Its TTFT less these and
        the time it queued before it started."""
        return max(self.fetch_s + self.prefill_s - self.between_pieces_s - self.waited_s, 0.0)


@dataclass
class DecodeStats:
    """The tokens generated after the prefill (``stream``/``generate``)."""

    new_tokens: int = 0
    decode_s: float = 0.0
    finish_reason: str | None = None  # "eos" | "stop" | "length"

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first one, per second of decoding."""
        steps = self.new_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0


@dataclass
class LoadingStats:
    """Loading the cached rows (engine/compute/layer_feed.py): read and placed ahead of the loop
    (pipelined) or in it; the reader's time (load_s, all tiers), the time placing the rows
    into the request's KV (place_s: values copied, keys rotated; on the reader's thread when
    ``placed_ahead``), the loop's waits for rows (load_wait_s), the loop's time less its waits
    (compute_s, the preview pass included)."""

    pipelined: bool = False
    placed_ahead: bool = False
    load_s: float = 0.0
    place_s: float = 0.0
    load_wait_s: float = 0.0
    compute_s: float = 0.0


@dataclass
class RatioDecision:
    """How ``ratio="auto"`` chose (engine/selection/controller.py): the ``ratio`` and why
    (``reason``),
    the ``floor`` asked for and the ``cap``; with estimates, seconds per layer of loading the
    cached rows (``load_layer_s``, placing them included), of computing one token
    (``token_layer_s``) and of placing one row (``fixed_row_layer_s``), the compute at the
    ratio chosen (``compute_layer_s``) and the ``tiers`` read."""

    ratio: float
    reason: str
    floor: float
    cap: float | None = None
    load_layer_s: float | None = None
    token_layer_s: float | None = None
    fixed_row_layer_s: float | None = None
    compute_layer_s: float | None = None
    tiers: list[str] = field(default_factory=list)


@dataclass
class ModeChoice:
    """Whether the device's cost profile ran the mode ``asked`` or a full prefill (``ran``;
    engine/selection/costs.py): each one's predicted seconds (``predicted_s``,
    ``full_predicted_s``, the
    measured overhead included; ``passes_s``, ``full_passes_s``, the profiled passes alone) and
    the passes computing what the store missed (``miss_passes``)."""

    asked: str
    ran: str
    predicted_s: float
    full_predicted_s: float
    passes_s: float
    full_passes_s: float
    miss_passes: int
    # "predicted" (the cost profile), "chunks missing" (LoadingConfig.full_when_missing) or
    # "exact prefix cache: ..." (its exact rows leave no more to compute: costs.py)
    reason: str = "predicted"


@dataclass
class ControllerStats:
    """The choices made for the request: the ratio (``ratio="auto"``) and the mode (a full
    prefill where faster); None where not asked."""

    ratio: RatioDecision | None = None
    mode: ModeChoice | None = None


@dataclass
class CalibrationStats:
    """The calibration the default config ran with (engine/selection/calibrated.py): its
    ``selector`` and
    ``ratio`` (None: no ratio met the ``target``, a full prefill ran), the fidelity measured
    there (``same_answer``, ``answer_kl``; None when not recorded), over how many ``prompts``,
    of which ``corpus`` (its hash's start) and when it was ``created`` (UTC)."""

    selector: str
    ratio: float | None
    target: dict
    same_answer: float | None
    answer_kl: float | None
    prompts: int
    corpus: str
    created: str


@dataclass
class RequestStats:
    """What one request did: its config (``mode``, blend's ``selector`` and ``ratio``), then
    one group per part; ``controller``: the choices made for it (``ControllerStats``);
    ``calibration``: the calibration the default config ran with, None when none was
    used."""

    mode: str
    selector: str | None = None
    ratio: float | None = None
    prompt: PromptStats = field(default_factory=PromptStats)
    cache: CacheStats = field(default_factory=CacheStats)
    compute: ComputeStats = field(default_factory=ComputeStats)
    timing: TimingStats = field(default_factory=TimingStats)
    decode: DecodeStats = field(default_factory=DecodeStats)
    loading: LoadingStats = field(default_factory=LoadingStats)
    controller: ControllerStats = field(default_factory=ControllerStats)
    calibration: CalibrationStats | None = None

    @property
    def recompute_fraction(self) -> float:
        """Mean over layers of recomputed chunk tokens / chunk tokens: the compute actually
        spent, so it includes the layers before a scoring selector's first check, where every
        token is computed (1 of 32 layers for cacheblend's default on a 32-layer model)."""
        per_layer = self.compute.recomputed_chunk_tokens_per_layer
        if not per_layer or not self.prompt.chunk_tokens:
            return 0.0
        return sum(per_layer) / (len(per_layer) * self.prompt.chunk_tokens)

    @property
    def compute_fraction(self) -> float:
        """Every token-layer this request computed (the main pass and the preview pass) over a
        full prefill's (prompt tokens x layers): its compute relative to a full prefill."""
        c, tokens = self.compute, self.prompt.tokens
        if not c.layers or not tokens:
            return 0.0
        return (sum(c.computed_per_layer) + c.preview_tokens * c.layers) / (tokens * c.layers)

    def to_dict(self) -> dict:
        """One flat dict: the config fields, every group's fields (the prompt's ``tokens`` as
        ``prompt_tokens``), ``controller``, and the derived fractions and decoding speed."""
        out: dict = {"mode": self.mode, "selector": self.selector, "ratio": self.ratio}
        for group in (self.prompt, self.cache, self.compute, self.timing, self.decode,
                      self.loading):
            out.update(asdict(group))
        out["prompt_tokens"] = out.pop("tokens")
        out["controller"] = asdict(self.controller)
        out["calibration"] = None if self.calibration is None else asdict(self.calibration)
        out["recompute_fraction"] = self.recompute_fraction
        out["compute_fraction"] = self.compute_fraction
        out["decode_tokens_per_s"] = self.decode.decode_tokens_per_s
        return out


def new_stats(layout: PromptLayout, config: BlendConfig) -> RequestStats:
    """Stats of a request about to run ``config`` on ``layout``."""
    blend = config.mode == "blend"
    chunk_tokens = layout.suffix_start - len(layout.prefix_ids)
    return RequestStats(
        mode=config.mode, selector=config.selector if blend else None,
        ratio=config.ratio if blend else None,
        prompt=PromptStats(layout.num_tokens, len(layout.prefix_ids), chunk_tokens,
                           len(layout.suffix_ids), len(layout.chunk_ids)),
    )
