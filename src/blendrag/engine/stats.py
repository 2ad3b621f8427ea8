"""Per-request statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestStats:
    """What one request did and how long it took.

    ``computed_per_layer[i]``: tokens whose layer i was computed (active tokens, suffix included).
    ``recomputed_chunk_tokens_per_layer[i]``: of those, chunk tokens (blend's recompute).
    """

    mode: str
    selector: str | None = None
    ratio: float | None = None
    prompt_tokens: int = 0
    prefix_tokens: int = 0
    chunk_tokens: int = 0
    suffix_tokens: int = 0
    chunks: int = 0
    chunk_hits: int = 0
    chunk_misses: int = 0
    prefix_hit: bool = False
    exact_first: bool = False  # the first passage's rows were its exact ones (ChunkContext)
    tokens_reused: int = 0
    # chunk profiles measured by this request (profile selector, first use)
    preview_tokens: int = 0  # suffix tokens the preview pass computed, at every layer
    layers: int = 0
    profiles_computed: int = 0
    computed_per_layer: list[int] = field(default_factory=list)
    recomputed_chunk_tokens_per_layer: list[int] = field(default_factory=list)
    # keys attended to by the computed tokens, per layer (attention work), and by the preview
    # pass over all its layers
    attended_keys_per_layer: list[int] = field(default_factory=list)
    preview_attended_keys: int = 0
    # framework LLMs: finding the chunks in a flat prompt and tokenizing its pieces (in ttft_s)
    match_s: float = 0.0
    kv_fetch_s: float = 0.0  # store lookups + computing missing chunk KVs
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    new_tokens: int = 0
    decode_s: float = 0.0
    finish_reason: str | None = None
    # what this request did to the store: StoreStats.since(before).to_dict()
    store: dict | None = None
    # seconds per phase (engine/phases.py) of a request prefilled with timed=True, else None
    phase_s: dict[str, float] | None = None
    # loading the cached rows (engine/layer_feed.py): read ahead of the loop or in it; the
    # reader's time (load_s, all tiers), the loop's waits for rows (load_wait_s), the loop's
    # time less its waits (compute_s, the preview pass included)
    pipelined: bool = False
    load_s: float = 0.0
    load_wait_s: float = 0.0
    compute_s: float = 0.0
    preview_load_work_s: float = 0.0  # the preview pass's copying of cached rows
    # attempts redone because a cached entry failed to load midway (that chunk recomputed)
    load_retries: int = 0
    # ratio="auto": the loading controller's choice and the estimates it used (controller.py)
    controller: dict | None = None

    @property
    def recompute_fraction(self) -> float:
        """Mean over layers of recomputed chunk tokens / chunk tokens: the compute actually
        spent, so it includes the layers before a scoring selector's first check, where every
        token is computed (1 of 32 layers for cacheblend's default on a 32-layer model)."""
        per_layer = self.recomputed_chunk_tokens_per_layer
        if not per_layer or not self.chunk_tokens:
            return 0.0
        return sum(per_layer) / (len(per_layer) * self.chunk_tokens)

    @property
    def compute_fraction(self) -> float:
        """Every token-layer this request computed (the main pass and the preview pass) over a
        full prefill's (prompt tokens x layers): its compute relative to a full prefill."""
        if not self.layers or not self.prompt_tokens:
            return 0.0
        total = sum(self.computed_per_layer) + self.preview_tokens * self.layers
        return total / (self.prompt_tokens * self.layers)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first one, per second of decoding."""
        steps = self.new_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["recompute_fraction"] = self.recompute_fraction
        d["compute_fraction"] = self.compute_fraction
        d["decode_tokens_per_s"] = self.decode_tokens_per_s
        return d
