"""What BlendLLM and ChatBlend share: config fields, per-call overrides and one request path."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Sequence

from langchain_core.documents import Document
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationStream, RequestStats
from blendrag.langchain._prompt import BlendPrompt
from blendrag.text_index import ChunkTextIndex

log = logging.getLogger(__name__)

_BLEND_KEYS = ("mode", "selector", "ratio", "check_layers")
_GENERATION_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed")
# Keyword arguments LangChain itself may pass down to _generate/_stream: not ours, not an error.
_LANGCHAIN_KEYS = frozenset({"stream", "model", "ls_structured_output_format"})


@dataclass
class BlendRequest:
    """One running request: its prompt layout and the engine's token stream."""

    prompt: BlendPrompt
    stream: GenerationStream


class BlendParams(BaseModel):
    """Fields and request path shared by :class:`BlendLLM` and :class:`ChatBlend`.

    Per call, ``documents=`` (the retrieved Documents) and any of ``mode``, ``selector``,
    ``ratio``, ``check_layers``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``
    may be passed as keyword arguments (``invoke(..., documents=docs)`` or ``.bind(...)``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: BlendEngine = Field(exclude=True)
    """The engine (model, tokenizer, chunk-KV store). Give it a ``chunk_prefix`` so that KVs
    precomputed at ingestion match the chains' prompts."""
    text_index: ChunkTextIndex = Field(default_factory=ChunkTextIndex, exclude=True)
    """Chunk texts recorded at ingestion; used to find chunks in a flat prompt."""
    mode: str = "blend"
    """``full`` | ``prefix`` | ``reuse`` | ``blend`` (see :class:`~blendrag.BlendConfig`)."""
    selector: str = "cacheblend"
    ratio: float = 0.15
    check_layers: tuple[int, ...] = (1,)
    max_tokens: int = 256
    """Maximum number of new tokens."""
    temperature: float = 0.0
    """0: greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | None = None
    """Stop strings, added to the ones given per call."""
    document_prompt: str = "{page_content}"
    """How the chain formats one Document into the prompt (``create_stuff_documents_chain``'s
    ``document_prompt``); the chunk text located in the prompt and recorded at ingestion."""
    streaming: bool = False
    """Route ``invoke`` through the token stream so callbacks get every token."""

    _last_stats: RequestStats | None = PrivateAttr(default=None)
    _last_prompt: BlendPrompt | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_configs(self) -> "BlendParams":
        if self.engine.prompts is None:
            raise ValueError("the engine has no tokenizer: LangChain models need one to read text prompts")
        self.blend_config()
        self.generation_config()
        return self

    @property
    def last_stats(self) -> RequestStats | None:
        """Stats of the last finished request (the last prompt of a batch)."""
        return self._last_stats

    @property
    def last_prompt(self) -> BlendPrompt | None:
        """Layout of the last request and how its chunks were found."""
        return self._last_prompt

    def blend_config(self, **overrides: Any) -> BlendConfig:
        values = {k: getattr(self, k) for k in _BLEND_KEYS}
        values.update({k: v for k, v in overrides.items() if k in _BLEND_KEYS})
        return BlendConfig(**values)

    def generation_config(self, stop: Sequence[str] | None = None, **overrides: Any) -> GenerationConfig:
        values = {k: getattr(self, k) for k in _GENERATION_KEYS}
        values.update({k: v for k, v in overrides.items() if k in _GENERATION_KEYS})
        stops = tuple(dict.fromkeys([*(self.stop or ()), *(stop or ())]))
        return GenerationConfig(max_new_tokens=values.pop("max_tokens"), stop=stops, **values)

    def _params(self) -> dict[str, Any]:
        return {
            "model": self.engine.name, **{k: getattr(self, k) for k in _BLEND_KEYS},
            **{k: getattr(self, k) for k in _GENERATION_KEYS}, "stop": self.stop,
            "document_prompt": self.document_prompt,
        }

    def _documents(self, kwargs: dict[str, Any]) -> Sequence[Document] | None:
        """The ``documents`` kwarg, after warning about kwargs nobody reads."""
        unknown = set(kwargs) - {"documents", *_BLEND_KEYS, *_GENERATION_KEYS, *_LANGCHAIN_KEYS}
        if unknown:
            log.warning("%s ignores unknown keyword arguments %s", type(self).__name__, sorted(unknown))
        docs = kwargs.get("documents")
        if docs is not None and not all(isinstance(d, Document) for d in docs):
            raise TypeError("documents= must be a list of langchain Document objects")
        return docs

    def _start(self, prompt: BlendPrompt, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> BlendRequest:
        """Prefill ``prompt`` (blending unless no chunk was found) and open its token stream."""
        blend = self.blend_config(**kwargs)
        if prompt.full_only:
            blend = dataclasses.replace(blend, mode="full")  # nothing cached to blend
        stream = self.engine.stream(prompt.layout, blend, self.generation_config(stop, **kwargs))
        return BlendRequest(prompt, stream)

    def _finish(self, request: BlendRequest) -> dict[str, Any]:
        """Record the finished request; its generation_info."""
        result = request.stream.result
        self._last_stats, self._last_prompt = result.stats, request.prompt
        return {"finish_reason": result.finish_reason, "blendrag": result.stats.to_dict(),
                "blendrag_prompt": request.prompt.info()}

    def _ls_params(self, model_type: str, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "ls_provider": "blendrag", "ls_model_type": model_type,
            "ls_model_name": kwargs["model"] if isinstance(kwargs.get("model"), str) else self.engine.name,
            "ls_temperature": kwargs.get("temperature", self.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", self.max_tokens),
        }
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params
