"""Typed request configs: how to prefill (mode + selector) and how to generate; the reader of
the ingestion option ``profile``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TypeVar

from blendrag.checks import check_at_least, check_count, is_count, is_finite_number

MODES = ("full", "prefix", "reuse", "blend")
DEVIATIONS = ("value", "key")
DEFAULT_RATIO = 0.20  # the knee of the fidelity frontier (docs/benchmarks.md); auto's floor
DEFAULT_SELECTOR = "preview"
AUTO = "auto"
MAX_TEMPERATURE = 100.0
DEFAULT_THREADS = 1
"""torch CPU threads of an engine's own calls on a CPU (``threads="auto"``, the default): the
fastest measured on a small shared CPU (engine/compute/threads.py says why; docs/benchmarks.md,
"CPU threads"). On a GPU "auto" leaves torch's own count."""


def threads_valid(threads: object) -> bool:
    """Whether ``threads`` is an engine's thread setting: a count >= 1, None (torch's own
    count) or "auto" (``DEFAULT_THREADS`` on a CPU, torch's own count on a GPU)."""
    return threads is None or threads == AUTO or (
        isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1)


@dataclass(frozen=True)
class SelectorOptions:
    """Options of one blend selector (a subclass per selector; the base: none)."""

    def check(self, ratio: float) -> None:
        """ValueError for options that do not fit ``ratio``."""


@dataclass(frozen=True)
class PreviewOptions(SelectorOptions):
    """``attention_floor``: added to each layer's normalized attention, so that tokens context
    moves much stay in reach where the preview, made over stale keys, reads them little.
    ``span``: tokens recomputed in contiguous windows of this many around the best-scored ones
    (CacheClip's spans), the same budget; 1: single tokens."""

    attention_floor: float = 4.0
    span: int = 1

    def check(self, ratio: float) -> None:
        floor = self.attention_floor
        # inline, not blendrag.checks: the default selector's options, checked every request
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) \
                or not 0 <= floor < math.inf:  # NaN too
            raise ValueError(f"attention_floor must be a finite number >= 0, got {floor!r}")
        if isinstance(self.span, bool) or not isinstance(self.span, int) or self.span < 1:
            raise ValueError(f"span must be an integer >= 1, got {self.span!r}")


@dataclass(frozen=True)
class CheckLayerOptions(SelectorOptions):
    """Scoring selectors (cacheblend, query): ``check_layers``, the layers at which tokens are
    scored (before the first one every chunk token is recomputed), and ``ratio_schedule``, the
    fraction of chunk tokens kept at each (non-increasing, ending at the ratio; None: halve at
    each check, ending at the ratio)."""

    check_layers: tuple[int, ...] = (1,)
    ratio_schedule: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        layers = tuple(self.check_layers)
        if not all(is_count(x) for x in layers):
            raise ValueError(f"check_layers must be layer indices (integers >= 0), got "
                             f"{self.check_layers!r}")
        if not layers or any(b <= a for a, b in zip(layers, layers[1:])) or layers[0] < 0:
            raise ValueError("check_layers must be non-empty, strictly increasing and >= 0, got "
                             f"{self.check_layers!r}")
        object.__setattr__(self, "check_layers", layers)
        if self.ratio_schedule is not None:
            schedule = tuple(self.ratio_schedule)
            if not all(is_finite_number(r) for r in schedule):
                raise ValueError(f"ratio_schedule must be numbers, got {self.ratio_schedule!r}")
            schedule = tuple(float(r) for r in schedule)
            if len(schedule) != len(layers):
                raise ValueError(f"ratio_schedule needs one ratio per check layer ({len(layers)}), "
                                 f"got {len(schedule)}")
            if any(not 0.0 <= r <= 1.0 for r in schedule) or any(
                    b > a for a, b in zip(schedule, schedule[1:])):
                raise ValueError("ratio_schedule must be non-increasing values in [0, 1], got "
                                 f"{schedule!r}")
            object.__setattr__(self, "ratio_schedule", schedule)

    def schedule(self, ratio: float) -> tuple[float, ...]:
        """The fraction kept at each check layer for ``ratio``."""
        if self.ratio_schedule is not None:
            return self.ratio_schedule
        n = len(self.check_layers)
        return tuple(min(1.0, ratio * 2 ** (n - 1 - i)) for i in range(n))

    def check(self, ratio: float) -> None:
        if self.ratio_schedule is not None and abs(self.ratio_schedule[-1] - ratio) > 1e-12:
            raise ValueError(f"ratio_schedule must end at ratio={ratio}, got "
                             f"{self.ratio_schedule!r}")

    def scaled(self, old: float, new: float) -> CheckLayerOptions:
        """These options for ratio ``new`` instead of ``old``: an explicit schedule scaled (each
        step capped at 1, ending at ``new``)."""
        if self.ratio_schedule is None or old <= 0:
            return replace(self, ratio_schedule=None)
        schedule = tuple(min(1.0, r * new / old) for r in self.ratio_schedule)
        return replace(self, ratio_schedule=(*schedule[:-1], new))


@dataclass(frozen=True)
class CacheBlendOptions(CheckLayerOptions):
    """``deviation``: score by the squared L2 of the values (``"value"``) or of the rotated keys
    (``"key"``)."""

    deviation: str = "value"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.deviation not in DEVIATIONS:
            raise ValueError(f"deviation must be one of {DEVIATIONS}, got {self.deviation!r}")


@dataclass(frozen=True)
class QueryOptions(CheckLayerOptions):
    """The attention of the suffix at ``check_layers[0]`` ranks the tokens."""


@dataclass(frozen=True)
class EpicOptions(SelectorOptions):
    """No options: the first ``ratio`` of each chunk's tokens."""


@dataclass(frozen=True)
class ProfileOptions(SelectorOptions):
    """No options: the stored context-sensitivity profile ranks the tokens."""


@dataclass(frozen=True)
class RandomOptions(SelectorOptions):
    """``seed`` of the uniform draw (an ablation)."""

    seed: int = 0

    def __post_init__(self) -> None:
        check_count("RandomOptions.seed", self.seed)


@dataclass(frozen=True)
class Ape:
    """APE (Adaptive Parallel Encoding, ICLR 2025) on blend's reused rows: the question's and
    every generated token's attention to the chunk rows not recomputed at a layer runs at
    ``temperature`` (logits divided by it) and its weight is multiplied by ``scale``, the rest
    of the prompt as it is, all in one softmax (engine/selection/ape.py). Rows recomputed are exact
    and
    left alone, so at ratio 1.0 nothing changes."""

    temperature: float = 0.9
    scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("temperature", "scale"):
            check_at_least(f"Ape.{name}", getattr(self, name), strict=True)

    @property
    def label(self) -> str:
        return f"ape{self.temperature:g}x{self.scale:g}"


SELECTORS: dict[str, type[SelectorOptions]] = {
    "preview": PreviewOptions, "cacheblend": CacheBlendOptions, "epic": EpicOptions,
    "profile": ProfileOptions, "query": QueryOptions, "random": RandomOptions,
}
"""The one registry of blend selectors: each name and the type of its options (the engine's
implementation of each is ``engine/selection/selectors.py``'s, keyed by the same options type)."""


def token_budget(fraction: float, tokens: int) -> int:
    """Tokens that recomputing ``fraction`` of ``tokens`` takes: ceil(fraction x tokens), less
    a 1e-9 slack so that float error never rounds an exact product up (0.3 x 10 is 3)."""
    return math.ceil(fraction * tokens - 1e-9)


OptionsT = TypeVar("OptionsT", bound=SelectorOptions)


@dataclass(frozen=True, init=False)
class BlendConfig:
    """How the prompt's KV is produced.

    mode:
      ``full``   plain prefill of every token (the exact baseline).
      ``prefix`` exact prefix caching: the prefix and the first chunk (computed right after the
                 prefix, hence an exact prefix) come from the cache, the rest is computed.
      ``reuse``  full KV reuse: every chunk from the cache, only the suffix computed.
      ``blend``  selective recompute: cached chunks plus a ``ratio`` of chunk tokens recomputed
                 at every layer, chosen by ``selector``.
    selector (blend only), with its ``options`` (None: the defaults of its options type,
    ``SELECTORS``):
      ``preview``    the default. Tokens the question reads (attention of the suffix over the
                     cached rows, in a preview pass of the suffix alone) weighted by how far
                     context moves them (``ChunkKV.context_shift``, measured at ingestion);
                     ``PreviewOptions``. Static after the preview: the same tokens at every
                     layer. engine/selection/preview.py, selectors.PreviewSelector; the default
                     ratio 0.20
                     is the knee of the fidelity frontier on SmolLM2-135M-Instruct
                     (docs/benchmarks.md).
      ``cacheblend`` KV deviation at the check layers with gradual filtering down to ``ratio``
                     (``CacheBlendOptions``).
      ``epic``       the first ``ratio`` of each chunk's tokens (attention-sink repair).
      ``profile``    the ``ratio`` of chunk tokens whose keys their context moves most, measured
                     at ingestion (``precompute(..., profile=True)``; measured on first use
                     otherwise). Static: no check layer, so compute is ``ratio`` at every layer.
      ``query``      tokens the suffix attends to most at the first check layer
                     (``QueryOptions``).
      ``random``     uniform random tokens (ablation; ``RandomOptions``).
    ratio: the fraction of chunk tokens recomputed, in [0, 1]; or ``"auto"`` / ``"auto>=F"``:
      the loading controller (engine/selection/controller.py) picks it per request, the largest
      whose
      recompute still hides under the loading of the cached rows, never below the floor F
      (default 0.20) and never above ``LoadingConfig.auto_cap``. After construction ``ratio``
      is a float (the floor when auto) and ``auto_ratio`` says whether it is auto; the
      controller's choice and the estimates behind it are in ``RequestStats.controller``.
    """

    mode: str
    selector: str
    ratio: float
    options: SelectorOptions
    ape: Ape | None = None
    auto_ratio: bool = field(default=False, init=False)
    calibrated: bool = field(default=False, init=False)

    def __init__(self, mode: str = "blend", selector: str | None = None,
                 ratio: float | str | None = None,
                 options: SelectorOptions | None = None, ape: Ape | None = None) -> None:
        # neither selector, ratio nor options given: the engine's calibration may choose them
        calibrated = selector is None and ratio is None and options is None and ape is None
        selector = DEFAULT_SELECTOR if selector is None else selector
        ratio = DEFAULT_RATIO if ratio is None else ratio
        auto = isinstance(ratio, str)
        value = _auto_floor(ratio) if isinstance(ratio, str) else ratio
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if selector not in SELECTORS:
            raise ValueError(f"selector must be one of {tuple(SELECTORS)}, got {selector!r}")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0.0 <= float(value) <= 1.0 or math.isnan(value)):
            raise ValueError(f"ratio must be in [0, 1], 'auto' or 'auto>=F', got {ratio!r}")
        kind = SELECTORS[selector]
        chosen = kind() if options is None else options
        if type(chosen) is not kind:
            raise ValueError(f"the {selector} selector takes {kind.__name__}, got "
                             f"{type(chosen).__name__}")
        chosen.check(float(value))
        if ape is not None and (not isinstance(ape, Ape) or mode not in ("blend", "reuse")):
            raise ValueError(f"ape must be an Ape, for blend or reuse (it acts on reused rows), "
                             f"got {ape!r} with mode={mode!r}")
        for name, v in (("mode", mode), ("selector", selector), ("ratio", value),
                        ("options", chosen), ("ape", ape), ("auto_ratio", auto),
                        ("calibrated", calibrated and mode == "blend")):
            object.__setattr__(self, name, v)

    def typed_options(self, kind: type[OptionsT]) -> OptionsT:
        """The options as ``kind`` (the selector's own options type)."""
        if not isinstance(self.options, kind):
            raise TypeError(f"the {self.selector} selector's options are "
                            f"{type(self.options).__name__}, not {kind.__name__}")
        return self.options

    @property
    def variant(self) -> str:
        """The selector with what changes its choice or its reading: ``preview``,
        ``preview/span4``, ``preview+ape0.9x1`` (a series of its own in the benchmarks)."""
        span = getattr(self.options, "span", 1)
        selector = self.selector if span == 1 else f"{self.selector}/span{span}"
        return selector + ("" if self.ape is None else f"+{self.ape.label}")

    @property
    def label(self) -> str:
        ape = "" if self.ape is None else f"+{self.ape.label}"
        if self.mode != "blend":
            return self.mode + ape
        auto = "auto>=" if self.auto_ratio else ""
        selector = self.variant.removesuffix(ape)
        return f"blend-{selector}@{auto}{self.ratio:g}{ape}"

    @property
    def schedule(self) -> tuple[float, ...]:
        """A scoring selector's fraction kept at each check layer (``CheckLayerOptions``)."""
        if not isinstance(self.options, CheckLayerOptions):
            raise ValueError(f"the {self.selector} selector has no check layers")
        return self.options.schedule(self.ratio)

    def at_ratio(self, ratio: float) -> BlendConfig:
        """This config with the controller's ``ratio`` (no longer auto); a check-layer schedule
        is scaled from the floor's."""
        options = self.options
        if isinstance(options, CheckLayerOptions):
            options = options.scaled(self.ratio, ratio)
        return BlendConfig(self.mode, self.selector, ratio, options, self.ape)


def _auto_floor(text: str) -> float:
    """The floor of ``"auto"`` (the default ratio) or ``"auto>=F"``."""
    if text == AUTO:
        return DEFAULT_RATIO
    head, sep, floor = text.partition(">=")
    try:
        if head == AUTO and sep:
            return float(floor)
    except ValueError:
        pass
    raise ValueError(f"ratio must be in [0, 1], 'auto' or 'auto>=F', got {text!r}")


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding: greedy when ``temperature == 0``, else sampling with top-k / top-p."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] | None = None  # None: the model's / tokenizer's EOS ids
    stream_holdback: bool = True  # hold back text that may be the start of a stop string

    def __post_init__(self) -> None:
        # checked inline, not with blendrag.checks: every request makes one (the walk test)
        for name, low in (("max_new_tokens", 1), ("top_k", 0), ("seed", 0)):
            value = getattr(self, name)
            if (name != "seed" or value is not None) and (
                    isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.stream_holdback, bool):
            raise ValueError(f"stream_holdback must be a bool, got {self.stream_holdback!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TEMPERATURE:
            # above a few units every token is about as likely as any other: noise, not text
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (0: "
                             f"greedy), got {t!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) \
                or not 0.0 < self.top_p <= 1.0:  # NaN too
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        stop = (() if self.stop is None else (self.stop,) if isinstance(self.stop, str)
                else tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        eos = self.eos_token_ids
        if eos is not None:
            eos = (eos,) if isinstance(eos, int) and not isinstance(eos, bool) else tuple(eos)
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in eos):
                raise ValueError(f"eos_token_ids must be token ids (integers >= 0), got "
                                 f"{self.eos_token_ids!r}")
            object.__setattr__(self, "eos_token_ids", eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


DEFAULT_BLEND = BlendConfig()
DEFAULT_GENERATION = GenerationConfig()


def profile_depth(profile: bool | int) -> int:
    """How many neighbours the ``profile`` option of ingestion asks for
    (``engine/caches/profile.py``):
    False/0 none, True/1 the predecessor, k the k predecessors."""
    if isinstance(profile, bool):
        return int(profile)
    if not isinstance(profile, int) or profile < 0:
        raise ValueError(f"profile must be a bool or a neighbour count >= 0, got {profile!r}")
    return profile
