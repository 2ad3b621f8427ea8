"""The settings both framework LLMs expose, defined once: flat fields (``mode``, ``selector``,
``ratio``, ``selector_options``, ``max_tokens``, ...) that build a ``BlendConfig`` and a
``GenerationConfig``, overridable per call.

``BlendSettings`` is a pydantic model; LangChain's ``BlendLLM``/``ChatBlend`` and LlamaIndex's
``BlendLLM`` inherit it (both frameworks' models are pydantic v2 models). It holds settings
only: what a request did is the client's (``client.BlendClient``). Needs pydantic, which both
framework extras install.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from blendrag.config import BlendConfig, GenerationConfig, SelectorOptions

log = logging.getLogger(__name__)

# Flat field -> BlendConfig / GenerationConfig field.
BLEND_FIELDS = {"mode": "mode", "selector": "selector", "ratio": "ratio",
                "selector_options": "options"}
GENERATION_FIELDS = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
                     "top_k": "top_k", "seed": "seed", "eos_token_ids": "eos_token_ids",
                     "stream_holdback": "stream_holdback"}
_BLEND = BlendConfig()
OVERRIDES = frozenset({*BLEND_FIELDS, *GENERATION_FIELDS})
"""Keyword arguments a single call may override."""


# LangChain's standard chat-model parameters that only a remote API uses: accepted (its
# standard tests pass them to every chat model) and of no use to an in-process model.
_REMOTE_ONLY = frozenset({"timeout", "max_retries", "api_key", "base_url"})
# Other libraries' names for a setting (HF generate, the OpenAI API): pointed to ours.
_SYNONYMS = {"max_new_tokens": "max_tokens", "max_length": "max_tokens", "do_sample": "temperature"}

class BlendSettings(BaseModel):
    """Flat request settings shared by the LangChain and LlamaIndex LLMs.

    Prefill (:class:`~blendrag.BlendConfig`): ``mode``, ``selector``, ``ratio`` (a fraction, or
    ``"auto"``/``"auto>=F"``), ``selector_options`` (the selector's options object, None: its
    defaults); ``selector`` and ``ratio`` left None run the engine's calibration for its model
    (``blendrag calibrate``), else ``preview`` at 0.20. Decoding
    (:class:`~blendrag.GenerationConfig`): ``max_tokens`` (new tokens),
    ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``seed``, ``stop`` (added to the
    per-call stop strings), ``eos_token_ids`` (None: the model's), ``stream_holdback``.

    ``namespace``: the tenant (or tenant/user) whose stored entries and recorded chunk texts
    the requests use, set by the application, never from request text (None: the engine's
    store's; a call may pass its own: ``BlendEngine.namespaced``).

    ``strict``: a prompt in which no known chunk is found raises
    :class:`~blendrag.integration.fallback.NoChunkFoundError` instead of running as a plain
    full prefill (which is otherwise logged as a warning the first time, naming the cause and
    the fix, and counted in ``fallbacks``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _known_settings(cls, data: Any) -> Any:
        """Refuse a keyword the class does not have (pydantic would drop it silently: a
        ``max_new_tokens=3`` that does nothing), naming the likely one."""
        if not isinstance(data, Mapping):
            return data
        known = {*cls.model_fields, *(f.alias for f in cls.model_fields.values() if f.alias)}
        data = {k: v for k, v in data.items() if k in known or k not in _REMOTE_ONLY}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            hints = [f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(
                _SYNONYMS.get(k, k), sorted(known), n=1, cutoff=0.6)) else repr(k)
                for k in unknown]
            raise ValueError(f"{cls.__name__} has no setting {', '.join(hints)}; its settings: "
                             f"{', '.join(sorted(k for k in known if not k.startswith('_')))}")
        return data

    # BlendConfig's own defaults: one place decides what an unconfigured request does
    mode: str = _BLEND.mode
    """``full`` | ``prefix`` | ``reuse`` | ``blend`` (see :class:`~blendrag.BlendConfig`)."""
    selector: str | None = None
    """None, with ``ratio`` None too: the engine's calibration for its model, else
    ``preview``."""
    ratio: float | str | None = None
    """None: the engine's calibrated ratio, else 0.20."""
    selector_options: SelectorOptions | None = None
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
    namespace: str | None = None
    """The tenant whose entries and texts requests use (None: the engine's store's)."""

    def blend_config(self, **overrides: Any) -> BlendConfig:
        """The fields' ``BlendConfig``, with any of ``BLEND_FIELDS`` in ``overrides`` instead."""
        values = {k: getattr(self, k) for k in BLEND_FIELDS}
        values.update({k: v for k, v in overrides.items() if k in BLEND_FIELDS})
        # what is left None is left to BlendConfig (and to the engine's calibration)
        return BlendConfig(**{BLEND_FIELDS[k]: v for k, v in values.items() if v is not None})

    def generation_config(self, stop: Sequence[str] | None = None,
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
        self.blend_config()
        self.generation_config()


def fields_from_configs(blend: BlendConfig | None = None,
                        generation: GenerationConfig | None = None) -> dict[str, Any]:
    """Flat field values of a ``BlendConfig`` and a ``GenerationConfig`` (either may be None);
    an auto ratio is spelled as it was given (``"auto>=F"``)."""
    out: dict[str, Any] = {}
    if blend is not None:
        out.update({k: getattr(blend, f) for k, f in BLEND_FIELDS.items()})
        if blend.auto_ratio:
            out["ratio"] = f"auto>={blend.ratio:g}"
        if blend.calibrated:  # left to the engine's calibration, as the config was
            out.update(selector=None, ratio=None, selector_options=None)
    if generation is not None:
        out.update({k: getattr(generation, f) for k, f in GENERATION_FIELDS.items()})
        out["stop"] = list(generation.stop) or None
    return out


CALL_KEYS = frozenset({*OVERRIDES, "blend_config", "generation_config", "stop", "strict",
                       "namespace"})
"""Keyword arguments a single call understands (besides the framework's own: documents, nodes)."""


def overrides_from(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Per-call overrides and stop strings: the flat keys of ``kwargs``, after the fields of the
    ``blend_config=`` and ``generation_config=`` objects when given (whose ``stop`` strings are
    the call's, with a ``stop=`` of the call's own)."""
    out = fields_from_configs(kwargs.get("blend_config"), kwargs.get("generation_config"))
    stop = tuple(out.pop("stop", None) or ())
    given = kwargs.get("stop")
    stop += (given,) if isinstance(given, str) else tuple(given or ())
    out.update({k: v for k, v in kwargs.items() if k in OVERRIDES})
    return out, stop


def warn_unknown(llm: str, kwargs: Mapping[str, Any], own: Collection[str]) -> None:
    """Log the per-call keyword arguments that neither ``CALL_KEYS`` nor the framework's ``own``
    keys name: ignored, but said."""
    unknown = set(kwargs) - CALL_KEYS - set(own)
    if unknown:
        log.warning("%s ignores unknown keyword arguments %s", llm, sorted(unknown))


def namespace_from(kwargs: Mapping[str, Any], default: str | None) -> str | None:
    """The call's ``namespace=`` when given (a string the application sets), else the LLM's."""
    namespace = kwargs.get("namespace", default)
    if namespace is not None and not isinstance(namespace, str):
        raise ValueError(f"namespace must be a string or None, got {type(namespace).__name__}")
    return namespace


def strict_from(kwargs: Mapping[str, Any], default: bool) -> bool:
    """The call's ``strict=`` when given (a bool), else the LLM's."""
    strict = kwargs.get("strict", default)
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")
    return strict
