"""Typed request configs: how to prefill (mode + selector) and how to generate; the reader of
the ingestion option ``profile``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

MODES = ("full", "prefix", "reuse", "blend")
SELECTORS = ("preview", "cacheblend", "epic", "profile", "query", "random")
DEVIATIONS = ("value", "key")
DEFAULT_RATIO = 0.20  # the knee of the fidelity frontier (docs/benchmarks.md); auto's floor


@dataclass(frozen=True)
class BlendConfig:
    """How the prompt's KV is produced.

    mode:
      ``full``   plain prefill of every token (the exact baseline).
      ``prefix`` exact prefix caching: the prefix and the first chunk (computed right after the
                 prefix, hence an exact prefix) come from the cache, the rest is computed.
      ``reuse``  full KV reuse: every chunk from the cache, only the suffix computed.
      ``blend``  selective recompute: cached chunks plus a ``ratio`` of chunk tokens recomputed
                 at every layer, chosen by ``selector``.
    selector (blend only):
      ``preview``    the default. Tokens the question reads (attention of the suffix over the
                     cached rows, in a preview pass of the suffix alone) weighted by how far
                     context moves them (``ChunkKV.context_shift``, measured at ingestion);
                     ``attention_floor`` is added to each layer's normalized attention. Static
                     after the preview: the same tokens at every layer. engine/preview.py,
                     selectors.PreviewSelector; the default ratio 0.20 is the knee of the
                     fidelity frontier on SmolLM2-135M-Instruct (docs/benchmarks.md).
      ``cacheblend`` KV deviation at ``check_layers`` with gradual filtering down to ``ratio``.
      ``epic``       the first ``ratio`` of each chunk's tokens (attention-sink repair).
      ``profile``    the ``ratio`` of chunk tokens whose keys their context moves most, measured
                     at ingestion (``precompute(..., profile=True)``; measured on first use
                     otherwise). Static: no check layer, so compute is ``ratio`` at every layer.
      ``query``      tokens the suffix attends to most at ``check_layers[0]``.
      ``random``     uniform random tokens (ablation).
    check_layers / ratio_schedule (cacheblend, query): layers at which tokens are scored; before
      the first one every chunk token is recomputed. ``ratio_schedule[i]`` is the fraction of chunk
      tokens kept at ``check_layers[i]``; non-increasing, ending at ``ratio``. Default: halve at
      each check, ending at ``ratio``.
    ratio="auto" (or ``auto_ratio=True``): the loading controller (engine/controller.py) picks
      the ratio per request: the largest whose recompute still hides under the loading of the
      cached rows, never below the floor ``ratio`` (0.20 with "auto"; ``auto_ratio=True`` keeps
      the ``ratio`` given) and never above ``LoadingConfig.auto_cap``. The choice and the
      estimates behind it are in ``RequestStats.controller``.
    """

    mode: str = "blend"
    selector: str = "preview"
    ratio: float | str = DEFAULT_RATIO
    check_layers: tuple[int, ...] = (1,)
    ratio_schedule: tuple[float, ...] | None = None
    deviation: str = "value"
    seed: int = 0
    attention_floor: float = 4.0
    auto_ratio: bool = False

    def __post_init__(self) -> None:
        if self.ratio == "auto":  # the default ratio is the quality floor
            object.__setattr__(self, "ratio", DEFAULT_RATIO)
            object.__setattr__(self, "auto_ratio", True)
        if not isinstance(self.auto_ratio, bool):
            raise ValueError(f"auto_ratio must be a bool, got {self.auto_ratio!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {SELECTORS}, got {self.selector!r}")
        if (isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float))
                or not 0.0 <= float(self.ratio) <= 1.0
                or math.isnan(self.ratio)):
            raise ValueError(f"ratio must be in [0, 1] or 'auto', got {self.ratio!r}")
        if (not isinstance(self.attention_floor, (int, float)) or math.isnan(self.attention_floor)
                or self.attention_floor < 0):
            raise ValueError(f"attention_floor must be >= 0, got {self.attention_floor!r}")
        if self.deviation not in DEVIATIONS:
            raise ValueError(f"deviation must be one of {DEVIATIONS}, got {self.deviation!r}")
        layers = tuple(int(x) for x in self.check_layers)
        if not layers or any(b <= a for a, b in zip(layers, layers[1:])) or layers[0] < 0:
            raise ValueError("check_layers must be non-empty, strictly increasing and >= 0, got "
                             f"{self.check_layers!r}")
        object.__setattr__(self, "check_layers", layers)
        schedule = self.ratio_schedule
        if schedule is None:
            n = len(layers)
            schedule = tuple(min(1.0, self.ratio * 2 ** (n - 1 - i)) for i in range(n))
        schedule = tuple(float(x) for x in schedule)
        if len(schedule) != len(layers):
            raise ValueError(f"ratio_schedule needs one ratio per check layer ({len(layers)}), got "
                             f"{len(schedule)}")
        if any(not 0.0 <= r <= 1.0 for r in schedule) or any(
            b > a for a, b in zip(schedule, schedule[1:])
        ):
            raise ValueError("ratio_schedule must be non-increasing values in [0, 1], got "
                             f"{schedule!r}")
        if abs(schedule[-1] - self.ratio) > 1e-12:
            raise ValueError(f"ratio_schedule must end at ratio={self.ratio}, got {schedule!r}")
        object.__setattr__(self, "ratio_schedule", schedule)

    @property
    def label(self) -> str:
        if self.mode != "blend":
            return self.mode
        auto = "auto>=" if self.auto_ratio else ""
        return f"blend-{self.selector}@{auto}{self.ratio:g}"

    def at_ratio(self, ratio: float) -> BlendConfig:
        """This config with the controller's ``ratio`` (no longer auto); the check-layer
        schedule is scaled from the floor's (each step capped at 1)."""
        floor = float(self.ratio)
        if floor > 0:
            schedule = tuple(min(1.0, r * ratio / floor) for r in self.ratio_schedule)
            schedule = (*schedule[:-1], ratio)
        else:
            schedule = None  # the default halving schedule of the new ratio
        return replace(self, ratio=ratio, ratio_schedule=schedule, auto_ratio=False)


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
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or math.isnan(self.temperature):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


DEFAULT_BLEND = BlendConfig()
DEFAULT_GENERATION = GenerationConfig()


def profile_depth(profile: bool | int) -> int:
    """How many neighbours the ``profile`` option of ingestion asks for (``engine/profile.py``):
    False/0 none, True/1 the predecessor, k the k predecessors."""
    if isinstance(profile, bool):
        return int(profile)
    if not isinstance(profile, int) or profile < 0:
        raise ValueError(f"profile must be a bool or a neighbour count >= 0, got {profile!r}")
    return profile
