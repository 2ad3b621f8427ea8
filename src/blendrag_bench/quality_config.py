"""What ``bench quality`` evaluates (a module of its own: the flows that lay its prompts out
read it too)."""

from __future__ import annotations

from dataclasses import dataclass

from blendrag.config import MODES, SELECTORS, Ape, BlendConfig, PreviewOptions
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag_bench.ratios import DEFAULT_RATIOS

FULL = BlendConfig(mode="full")
INGEST_ORDERS = ("prompt", "shuffled")


@dataclass(frozen=True)
class QualityConfig:
    """What to evaluate: the model, the modes / selectors / ratios, and decoding limits.

    ``model``: a short name, folder, GGUF file or hub id (``BlendEngine.from_pretrained``);
    ``"demo"`` is the packaged tiny model. ``chat``: wrap prompts in the tokenizer's chat
    template (None: off for the demo model, which was trained on plain prompts; the
    tokenizer's template when it has one otherwise). ``max_chunk_tokens``: each chunk is cut
    (after a word) to this many tokens, as the CacheBlend paper cuts passages to 512. Full
    prefill is always run: it is the reference of the first-token comparison and of the
    speedups. Blend runs every
    selector at every ratio. ``warmup``: run each config's prefill once, untimed, first.
    ``ingest_order`` and ``profile_neighbours``: chunks are precomputed in prompt order or a
    seeded shuffle, and profiles are measured after each chunk's ``profile_neighbours``
    predecessors in that order (``BlendEngine.precompute(..., profile=k)``).
    """

    model: str = DEFAULT_MODEL
    gguf_file: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    chat: bool | None = None
    modes: tuple[str, ...] = MODES
    selectors: tuple[str, ...] = tuple(SELECTORS)
    ratios: tuple[float, ...] = DEFAULT_RATIOS
    spans: tuple[int, ...] = (1,)  # the preview selector's windows (PreviewOptions.span)
    apes: tuple[Ape | None, ...] = (None,)  # each blend config with each (None: without APE)
    max_new_tokens: int = 16
    summary_max_new_tokens: int = 128
    warmup: bool = True
    ingest_order: str = "prompt"
    seed: int = 0
    profile_neighbours: int = 1
    max_chunk_tokens: int | None = 512

    def __post_init__(self) -> None:
        if self.max_chunk_tokens is not None and self.max_chunk_tokens < 1:
            raise ValueError(f"max_chunk_tokens must be >= 1 or None, got {self.max_chunk_tokens}")
        if self.profile_neighbours < 1:
            raise ValueError(f"profile_neighbours must be >= 1, got {self.profile_neighbours}")
        if self.ingest_order not in INGEST_ORDERS:
            raise ValueError(f"ingest_order must be one of {INGEST_ORDERS}, got "
                             f"{self.ingest_order!r}")
        object.__setattr__(self, "modes", tuple(self.modes))
        object.__setattr__(self, "selectors", tuple(self.selectors))
        object.__setattr__(self, "ratios", tuple(float(r) for r in self.ratios))
        object.__setattr__(self, "spans", tuple(self.spans))
        object.__setattr__(self, "apes", tuple(self.apes))
        if not self.apes or any(a is not None and not isinstance(a, Ape) for a in self.apes):
            raise ValueError(f"apes must be Ape settings or None, got {self.apes!r}")
        if not self.spans or any(isinstance(w, bool) or not isinstance(w, int) or w < 1
                                 for w in self.spans):
            raise ValueError(f"spans must be integers >= 1, got {self.spans!r}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes!r}")
        if "blend" in self.modes:
            if not self.selectors or any(s not in SELECTORS for s in self.selectors):
                raise ValueError(f"selectors must be a non-empty subset of {tuple(SELECTORS)}, got "
                                 f"{self.selectors!r}")
            if not self.ratios or any(not 0.0 < r <= 1.0 for r in self.ratios):
                raise ValueError(f"ratios must be non-empty values in (0, 1], got {self.ratios!r}")
        for name in ("max_new_tokens", "summary_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def configs(self) -> list[BlendConfig]:
        """Full first, then prefix / reuse, then blend for each selector over the ratios."""
        out = [FULL] + [BlendConfig(mode=m) for m in ("prefix", "reuse") if m in self.modes]
        if "blend" in self.modes:
            for s in self.selectors:
                spans = self.spans if s == "preview" else (1,)
                out += [BlendConfig(mode="blend", selector=s, ratio=r,
                                    options=PreviewOptions(span=w) if w > 1 else None, ape=a)
                        for w in spans for a in self.apes for r in self.ratios]
        return out

    @property
    def model_name(self) -> str:
        return self.model
