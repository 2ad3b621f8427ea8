"""The configuration both framework LLMs expose, defined once: flat fields (``mode``,
``selector``, ``ratio``, ``max_tokens``, ...) that build a ``BlendConfig`` and a
``GenerationConfig``, overridable per call, and the record of the last finished request.

``BlendFields`` is a pydantic model; LangChain's ``BlendLLM``/``ChatBlend`` and LlamaIndex's
``BlendLLM`` inherit it (both frameworks' models are pydantic v2 models). Needs pydantic,
which both framework extras install.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import RequestStats
from blendrag.integration.flat_prompt import FlatLayout
from blendrag.integration.requests import BlendRequest, FallbackFixes, FallbackMonitor
from blendrag.integration.text_index import ChunkTextIndex

# Flat field -> BlendConfig / GenerationConfig field.
BLEND_FIELDS = {"mode": "mode", "selector": "selector", "ratio": "ratio",
                "check_layers": "check_layers",
                "ratio_schedule": "ratio_schedule", "deviation": "deviation",
                "selector_seed": "seed", "attention_floor": "attention_floor"}
GENERATION_FIELDS = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
                     "top_k": "top_k", "seed": "seed", "eos_token_ids": "eos_token_ids",
                     "stream_holdback": "stream_holdback"}
_BLEND = BlendConfig()
OVERRIDES = frozenset({*BLEND_FIELDS, *GENERATION_FIELDS})
"""Keyword arguments a single call may override."""


class BlendFields(BaseModel):
    """Flat request settings shared by the LangChain and LlamaIndex LLMs.

    Prefill (:class:`~blendrag.BlendConfig`): ``mode``, ``selector``, ``ratio``,
    ``check_layers``, ``ratio_schedule``, ``deviation``, ``attention_floor``, ``selector_seed``
    (the ``random`` selector's seed). Decoding (:class:`~blendrag.GenerationConfig`):
    ``max_tokens`` (new tokens), ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``seed``,
    ``stop`` (added to the per-call stop strings), ``eos_token_ids`` (None: the model's),
    ``stream_holdback``.

    ``strict``: a prompt in which no known chunk is found raises
    :class:`~blendrag.integration.requests.NoChunkFoundError` instead of running as a plain
    full prefill (which is otherwise logged as a warning the first time, naming the cause and
    the fix, and counted in ``fallbacks``).
    """

    _fallback_fixes: ClassVar[FallbackFixes]
    """The framework's one-line fix of each fallback cause (set by each LLM class)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # BlendConfig's own defaults: one place decides what an unconfigured request does
    mode: str = _BLEND.mode
    """``full`` | ``prefix`` | ``reuse`` | ``blend`` (see :class:`~blendrag.BlendConfig`)."""
    selector: str = _BLEND.selector
    ratio: float = _BLEND.ratio
    attention_floor: float = _BLEND.attention_floor
    check_layers: tuple[int, ...] = _BLEND.check_layers
    ratio_schedule: tuple[float, ...] | None = None
    deviation: str = _BLEND.deviation
    selector_seed: int = _BLEND.seed
    max_tokens: int = 256
    """Maximum number of new tokens."""
    temperature: float = 0.0
    """0: greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | None = None
    """Stop strings, added to the ones given per call."""
    eos_token_ids: tuple[int, ...] | None = None
    stream_holdback: bool = True
    strict: bool = False
    """Refuse (raise) instead of falling back to a full prefill when no known chunk is found."""

    _fallback: FallbackMonitor = PrivateAttr(default_factory=FallbackMonitor)
    _last_stats: RequestStats | None = PrivateAttr(default=None)
    _last_prompt: FlatLayout | None = PrivateAttr(default=None)

    @property
    def last_stats(self) -> RequestStats | None:
        """Stats of the last finished request (a stream finishes when exhausted)."""
        return self._last_stats

    @property
    def fallbacks(self) -> int:
        """Requests of this LLM that found no known chunk and ran as a plain full prefill."""
        return self._fallback.count

    def _fallback_hook(self, index: ChunkTextIndex,
                       documents: int = 0) -> Callable[[FlatLayout], None]:
        """What ``requests.start`` calls on a fallback: warn once and count, or raise."""
        return lambda flat: self._fallback.check(flat, type(self).__name__, len(index),
                                                 self._fallback_fixes, self.strict, documents)

    @property
    def last_prompt(self) -> FlatLayout | None:
        """Layout of the last finished request and how its chunks were found."""
        return self._last_prompt

    def make_blend_config(self, **overrides: Any) -> BlendConfig:
        """The fields' ``BlendConfig``, with any of ``BLEND_FIELDS`` in ``overrides`` instead."""
        values = {k: getattr(self, k) for k in BLEND_FIELDS}
        values.update({k: v for k, v in overrides.items() if k in BLEND_FIELDS})
        return BlendConfig(**{BLEND_FIELDS[k]: v for k, v in values.items()})

    def make_generation_config(self, stop: Sequence[str] | None = None,
                               **overrides: Any) -> GenerationConfig:
        """The fields' ``GenerationConfig``, with any of ``GENERATION_FIELDS`` in ``overrides``
        instead and ``stop`` added to the field's stop strings."""
        values = {k: getattr(self, k) for k in GENERATION_FIELDS}
        values.update({k: v for k, v in overrides.items() if k in GENERATION_FIELDS})
        stops = tuple(dict.fromkeys([*(self.stop or ()), *(stop or ())]))
        return GenerationConfig(stop=stops, **{GENERATION_FIELDS[k]: v for k, v in values.items()})

    def settings(self) -> dict[str, Any]:
        """Every flat field's value (identifying parameters)."""
        return {k: getattr(self, k) for k in (*BLEND_FIELDS, *GENERATION_FIELDS, "stop")}

    def _check_configs(self) -> None:
        """Raise ValueError now for settings no config accepts."""
        self.make_blend_config()
        self.make_generation_config()

    def _finished(self, request: BlendRequest) -> dict[str, Any]:
        """Record a finished request as the last one; its info (finish reason, stats, layout)."""
        self._last_stats, self._last_prompt = request.result.stats, request.prompt
        return request.info()


def fields_from_configs(blend: BlendConfig | None = None,
                        generation: GenerationConfig | None = None,
                        ) -> dict[str, Any]:
    """Flat field values of a ``BlendConfig`` and a ``GenerationConfig`` (either may be None)."""
    out: dict[str, Any] = {}
    if blend is not None:
        out.update({k: getattr(blend, f) for k, f in BLEND_FIELDS.items()})
    if generation is not None:
        out.update({k: getattr(generation, f) for k, f in GENERATION_FIELDS.items()})
        out["stop"] = list(generation.stop) or None
    return out


def overrides_from(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Per-call overrides and stop strings: the flat keys of ``kwargs``, after the fields of the
    ``blend_config=`` and ``generation_config=`` objects when given (whose ``stop`` strings are
    the call's)."""
    out = fields_from_configs(kwargs.get("blend_config"), kwargs.get("generation_config"))
    stop = tuple(out.pop("stop", None) or ())
    out.update({k: v for k, v in kwargs.items() if k in OVERRIDES})
    return out, stop
