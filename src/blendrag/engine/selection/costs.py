"""What a prefill costs on this device, profiled once, and whether a request runs faster as a
full prefill (CacheBlend §5 profiles the recompute offline; here the profile also answers
which mode to run).

On a GPU a prompt of a few thousand tokens is bound by kernel launches as much as by FLOPs: a
cached request runs more kernels per layer than it saves FLOPs below some prompt size (the
preview pass is a second pass; scattered rows run smaller kernels), and a request whose chunks
miss computes them first. Such a request is slower than a plain full prefill, which is also
exact. ``DeviceCosts`` times the layer loop on this runner once (random ids over a buffer of
zeros: the values do not change the time) at a few prompt sizes, for three kinds of pass:

- ``causal``: every token (a full prefill; a chunk computed after its prefix);
- ``tail``: contiguous queries at the end (reuse's suffix, the preview pass, prefix mode);
- ``scattered``: 15 % of the tokens scattered plus a suffix (blend's selected tokens);

and fits each kind's time per layer as ``a + b x tokens + c x pairs`` (pairs: the query-key
pairs attended) by least squares. A request's time in each mode is then a sum of such passes
(``predict``), plus what it loads sequentially and the chunks it must compute first.

What the passes leave out (placing and rotating cached rows, the selection, the host's time
launching many small kernels: on an H200 the preview pass of a 3k-token prompt took 38 ms where
its passes predict a few) is measured on the requests themselves: ``observe`` keeps, per mode,
the least time a request of that mode took beyond its prediction, and ``overhead`` adds it to
later predictions once ``TRIALS`` requests have run (the first may include compiling kernels).
Only requests run alone at their steady state count (``observe_choice``): not one packed with
others, nor one whose pass shape was captured now or awaits its capture.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Protocol

import torch

import blendrag.engine.request.head as head_rules
from blendrag.config import BlendConfig, CheckLayerOptions, token_budget
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.request.head import Head
from blendrag.engine.request.stats import ModeChoice, RequestStats
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables
from blendrag.prompt import PromptLayout

log = logging.getLogger(__name__)

KINDS = ("causal", "tail", "scattered")
TRIALS = 2  # requests of a mode measured before its overhead counts


class Profiled(Protocol):
    """What profiling needs of a runner (``ModelRunner`` has it): its device, model, context,
    a request buffer, RoPE tables and a run of the layer loop. A protocol, so that the runner
    may hold its profile without this module importing the runner."""

    device: torch.device
    adapter: LlamaAdapter

    @property
    def max_positions(self) -> int: ...
    def buffer(self, capacity: int) -> FusedKV: ...
    def rope(self, n: int) -> RopeTables: ...
    def run(self, plan: LoopPlan, fused: FusedKV, rope: RopeTables) -> object: ...


@dataclass(frozen=True)
class PromptShape:
    """What a request's cost depends on: prompt tokens ``n``, prefix, chunk and suffix tokens,
    the end of the first chunk (prefix mode's exact rows), the prompt length of each pass that
    computes what the store misses first (``ChunkCache.miss_passes``), seconds of loading the
    loop waits for (sequential loading: all of it)."""

    n: int
    prefix: int
    chunks: int
    suffix: int
    first_chunk_end: int
    miss_passes: tuple[int, ...] = ()
    load_s: float = 0.0


@dataclass(frozen=True)
class PassCost:
    """Seconds per layer of one kind of pass: ``a + b x tokens + c x pairs``."""

    a: float
    b: float
    c: float

    def seconds(self, tokens: float, pairs: float) -> float:
        return max(self.a + self.b * tokens + self.c * pairs, 0.0)


class DeviceCosts:
    """The fitted cost of each kind of pass on one runner (``profile``), and each mode's
    predicted time for a prompt shape (``predict``)."""

    def __init__(self, layers: int, kinds: dict[str, PassCost]) -> None:
        self.layers = layers
        self.kinds = kinds
        self._gaps: dict[str, tuple[int, float]] = {}  # mode label -> (requests, least gap)

    def observe(self, label: str, predicted_s: float, took_s: float) -> None:
        """A request of mode ``label`` took ``took_s`` where ``predicted_s`` was predicted:
        the least such gap is the mode's overhead (a slow outlier never counts against it)."""
        seen, gap = self._gaps.get(label, (0, math.inf))
        self._gaps[label] = (seen + 1, min(gap, took_s - predicted_s))

    def overhead(self, label: str) -> float:
        """Seconds a request of mode ``label`` takes beyond its passes (0 until measured on
        ``TRIALS`` requests; may be negative where the passes overestimate)."""
        seen, gap = self._gaps.get(label, (0, 0.0))
        return gap if seen >= TRIALS else 0.0

    @classmethod
    def profile(cls, runner: Profiled, sizes: tuple[int, ...] = (256, 1024, 2048),
                repeats: int = 2) -> DeviceCosts:
        """Time each kind of pass at each prompt size (clipped to the model's context) on
        ``runner``, the fastest of ``repeats`` after a warm-up, and fit the costs."""
        sizes = tuple(sorted({min(s, runner.max_positions) for s in sizes}))
        rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
        for n in sizes:
            for kind, pos in _passes(n, runner.device).items():
                seconds = _time_pass(runner, n, pos, repeats)
                tokens, pairs = float(pos.numel()), float((pos + 1).sum())
                rows[kind].append((tokens, pairs, seconds / runner.adapter.num_layers))
        return cls(runner.adapter.num_layers, {k: _fit(v) for k, v in rows.items()})

    def predict(self, config: BlendConfig, shape: PromptShape) -> float:
        """Seconds of ``config`` on a prompt of ``shape`` (its layer loops, the chunks it
        computes first and the loading it waits for)."""
        s = shape
        full = self.pass_s("causal", s.n, s.n * (s.n + 1) / 2)
        if config.mode == "full":
            return full
        # what the store misses is computed first: causal passes (then stored)
        missing = sum(self.pass_s("causal", m, m * (m + 1) / 2) for m in s.miss_passes)
        if config.mode == "prefix":
            tail = s.n - s.first_chunk_end
            t = self.pass_s("tail", tail, tail * (s.n + s.first_chunk_end + 1) / 2)
        elif config.mode == "reuse":
            t = self._suffix(s)
        else:
            t = self._blend(config, s)
        return t + missing + s.load_s

    def pass_s(self, kind: str, tokens: float, pairs: float) -> float:
        """Seconds of a pass of ``kind`` through every layer."""
        return self.layers * self.kinds[kind].seconds(tokens, pairs)

    def _suffix(self, s: PromptShape) -> float:
        return self.pass_s("tail", s.suffix, s.suffix * (s.n - (s.suffix - 1) / 2))

    def _blend(self, config: BlendConfig, s: PromptShape) -> float:
        chosen = token_budget(config.ratio, s.chunks)
        # the chosen chunk tokens sit, on average, mid-way through the chunks
        pairs = chosen * (s.prefix + s.chunks / 2) + s.suffix * (s.n - (s.suffix - 1) / 2)
        per_layer = self.pass_s("scattered", chosen + s.suffix, pairs) / self.layers
        t = self.layers * per_layer
        if config.selector == "preview":
            t += self._suffix(s)
        options = config.options
        if isinstance(options, CheckLayerOptions):  # every token up to the first check
            first = options.check_layers[0] + 1
            t += first * (self.pass_s("causal", s.n, s.n * (s.n + 1) / 2) / self.layers
                          - per_layer)
        return t


def _passes(n: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The positions each kind of pass computes on a prompt of ``n`` tokens."""
    suffix = min(64, max(n // 8, 1))
    g = torch.Generator().manual_seed(n)
    chosen = torch.randperm(n - suffix, generator=g)[:int(0.15 * (n - suffix))].sort().values
    return {"causal": torch.arange(n, device=device),
            "tail": torch.arange(n - suffix, n, device=device),
            "scattered": torch.cat([chosen.to(device), torch.arange(n - suffix, n,
                                                                    device=device)])}


def _time_pass(runner: Profiled, n: int, pos: torch.Tensor, repeats: int) -> float:
    # drawn on the host: the device's generator stays out of the CUDA graphs' captures
    ids = torch.randint(3, 100, (n,), generator=torch.Generator().manual_seed(n))
    ids = ids.to(runner.device)
    fused, rope = runner.buffer(n), runner.rope(n)  # rows not computed: zeros or earlier rows
    best = float("inf")
    for i in range(repeats + 1):
        _sync(runner.device)
        t0 = time.perf_counter()
        runner.run(LoopPlan(ids, pos), fused, rope)
        _sync(runner.device)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def _fit(rows: list[tuple[float, float, float]]) -> PassCost:
    """Least squares of seconds against (1, tokens, pairs), no coefficient below zero."""
    x = torch.tensor([[1.0, t, p] for t, p, _ in rows], dtype=torch.float64)
    y = torch.tensor([s for _, _, s in rows], dtype=torch.float64)
    scale = x.abs().amax(dim=0).clamp_min(1.0)  # columns of very different sizes
    coef = torch.linalg.lstsq(x / scale, y[:, None]).solution[:, 0] / scale
    if (coef < 0).any():  # too few sizes to tell the terms apart: drop the negative ones
        keep = coef >= 0
        sub = torch.linalg.lstsq((x / scale)[:, keep], y[:, None]).solution[:, 0]
        coef = torch.zeros(3, dtype=torch.float64)
        coef[keep] = (sub / scale[keep]).clamp_min(0.0)
    a, b, c = coef.tolist()
    return PassCost(a, b, c)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # this thread's stream: see request/prefill.py ``_sync``
        torch.cuda.current_stream(device).synchronize()


FULL = BlendConfig(mode="full")


def choose_mode(costs: DeviceCosts, config: BlendConfig,
                shape: PromptShape) -> tuple[BlendConfig, ModeChoice]:
    """``config``, or a full prefill when ``costs`` predict that ``config`` would be slower on a
    prompt of ``shape``, each mode's prediction with the overhead measured on its requests;
    and the choice's record (``asked``, ``ran``, the predictions)."""
    passes_s, full_passes_s = costs.predict(config, shape), costs.predict(FULL, shape)
    mode_s = passes_s + costs.overhead(config.label)  # what its passes leave out, measured
    full_s = full_passes_s + costs.overhead(FULL.label)
    record = ModeChoice(config.label, config.label, mode_s, full_s, passes_s, full_passes_s,
                        len(shape.miss_passes))
    if mode_s <= full_s:
        return config, record
    record.ran = FULL.label
    log.info("%s predicted slower than a full prefill here (%.1f ms vs %.1f ms): running a "
             "full prefill", config.label, mode_s * 1e3, full_s * 1e3)
    return FULL, record


def observe_choice(costs: DeviceCosts, choice: ModeChoice, stats: RequestStats) -> None:
    """Fold what a request whose mode was chosen took into ``costs``: its own work
    (``TimingStats.work_s``: no queueing, no time left to requests served beside it), when it
    ran alone and at its steady state. A pass whose shape was captured now, or seen once and run
    by the layer loop until it is, launches every kernel from Python: on a GPU it is several
    times slower than its replays. Counted, it could make a mode look slower than a full
    prefill, and once the mode runs full its gap is never measured again: the warm-up's
    warming requests would decide every later one."""
    if stats.compute.warming_passes or stats.compute.packed_requests > 1:
        return
    passes = choice.full_passes_s if choice.ran != choice.asked else choice.passes_s
    costs.observe(choice.ran, passes, stats.timing.work_s)


def exact_path_choice(layout: PromptLayout, config: BlendConfig, exact_tokens: int,
                      head: Head) -> ModeChoice | None:
    """A full prefill's record when the exact path, a full prefill taking the prefix cache's
    ``exact_tokens`` exact rows, computes no more tokens than ``config`` would after its own
    ``head`` (exact and approximate rows): then it is at least as fast and exact (a chat's
    next turn after exact turns; the prefix cache keeps every finished request). None when
    ``config`` computes fewer, or is no blend or reuse."""
    if config.mode not in ("blend", "reuse") or exact_tokens <= 0:
        return None
    full_tail = layout.num_tokens - exact_tokens
    if head_rules.tail_only(layout, config, head):
        cached_tail = layout.num_tokens - head.rows
    else:
        rest = head_rules.after(layout, head)
        chunk_tokens = rest.suffix_start - len(rest.prefix_ids)
        ratio = config.ratio if config.mode == "blend" else 0.0
        preview = len(rest.suffix_ids) if config.mode == "blend" and config.selector == "preview" \
            else 0  # its preview pass computes the suffix once more
        cached_tail = (head.rows - head.taken + token_budget(ratio, chunk_tokens)
                       + len(rest.suffix_ids) + preview)
    if full_tail > cached_tail:
        return None
    log.info("the exact prefix-cache path computes %d tokens, %s %d: running it", full_tail,
             config.label, cached_tail)
    return ModeChoice(config.label, FULL.label, math.nan, math.nan, math.nan, math.nan, 0,
                      reason=f"exact prefix cache: {full_tail} tokens to compute, "
                             f"{config.label} {cached_tail}")
