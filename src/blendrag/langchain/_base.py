"""What BlendLLM and ChatBlend share: LangChain's side of one request (kwargs, Documents,
generation info, tracing params) over the framework-neutral core (``blendrag.integration``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from langchain_core.documents import Document
from pydantic import Field, model_validator

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine
from blendrag.integration import requests
from blendrag.integration.fields import OVERRIDES, BlendFields
from blendrag.integration.ingestion import default_text_index
from blendrag.integration.requests import BlendRequest, FallbackFixes
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.langchain._prompt import BlendPrompt, blend_prompt

log = logging.getLogger(__name__)

_FIXES = FallbackFixes(
    empty_index="ingest through BlendChroma.from_documents(docs, embedding=..., llm=llm), or open "
                "an existing collection with BlendChroma(..., llm=llm), which records its texts",
    not_in_prompt="the chain writes each Document differently from document_prompt: give the LLM "
                  "the chain's document prompt (BlendLLM(..., document_prompt=...))",
    documents_not_in_prompt="give the LLM the chain's document prompt "
                            "(BlendLLM(..., document_prompt=...)), the spelling of each Document "
                            "in the prompt",
)

# Keyword arguments LangChain itself may pass down to _generate/_stream: not ours, not an error.
_LANGCHAIN_KEYS = frozenset({"stream", "model", "ls_structured_output_format"})


class BlendParams(BlendFields):
    """Fields and request path shared by :class:`BlendLLM` and :class:`ChatBlend`.

    The flat request settings (``mode``, ``selector``, ``ratio``, ``check_layers``,
    ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ...) are
    :class:`~blendrag.integration.fields.BlendFields`'. Per call, ``documents=`` (the retrieved
    Documents) and any of those settings may be passed as keyword arguments
    (``invoke(..., documents=docs)`` or ``.bind(...)``).
    """

    engine: BlendEngine = Field(exclude=True)
    """The engine (model, tokenizer, chunk-KV store). Give it a ``chunk_prefix`` so that KVs
    precomputed at ingestion match the chains' prompts."""
    text_index: ChunkTextIndex = Field(default_factory=ChunkTextIndex, exclude=True)
    """Chunk texts recorded at ingestion; used to find chunks in a flat prompt. Default: kept
    with the engine's KV store when it has a disk tier (``<disk_dir>/text_index``), else in
    memory."""
    document_prompt: str = "{page_content}"
    """How the chain formats one Document into the prompt (``create_stuff_documents_chain``'s
    ``document_prompt``); the chunk text located in the prompt and recorded at ingestion. The
    default is the one chunk template of both integrations (``blendrag.integration.chunks``)."""
    streaming: bool = False
    """Route ``invoke`` through the token stream so callbacks get every token."""

    _fallback_fixes: ClassVar[FallbackFixes] = _FIXES

    @model_validator(mode="before")
    @classmethod
    def _default_text_index(cls, data: Any) -> Any:
        """No ``text_index`` given: the engine's (persisted with its KV store when that has a
        disk tier, so a new process finds the texts ingested by an earlier one)."""
        if isinstance(data, dict) and data.get("text_index") is None and "engine" in data:
            data = {**data, "text_index": default_text_index(data["engine"])}
        return data

    @model_validator(mode="after")
    def _check_settings(self) -> BlendParams:
        if self.engine.prompts is None:
            raise ValueError("the engine has no tokenizer: LangChain models need one to read text "
                             "prompts")
        self._check_configs()
        return self

    def blend_config(self, **overrides: Any) -> BlendConfig:
        """The request's ``BlendConfig`` (the fields, with per-call ``overrides``)."""
        return self.make_blend_config(**overrides)

    def generation_config(self, stop: Sequence[str] | None = None,
                          **overrides: Any) -> GenerationConfig:
        """The request's ``GenerationConfig`` (the fields, with the call's ``stop`` and
        ``overrides``)."""
        return self.make_generation_config(stop, **overrides)

    def _params(self) -> dict[str, Any]:
        return {"model": self.engine.name, **self.settings(),
                "document_prompt": self.document_prompt}

    def _documents(self, kwargs: dict[str, Any]) -> Sequence[Document] | None:
        """The ``documents`` kwarg, after warning about kwargs nobody reads."""
        unknown = set(kwargs) - {"documents", *OVERRIDES, *_LANGCHAIN_KEYS}
        if unknown:
            log.warning("%s ignores unknown keyword arguments %s", type(self).__name__,
                        sorted(unknown))
        docs = kwargs.get("documents")
        if docs is not None and not all(isinstance(d, Document) for d in docs):
            raise TypeError("documents= must be a list of langchain Document objects")
        return docs

    def _start(self, prompt: str, wrap: bool, stop: Sequence[str] | None,
               kwargs: dict[str, Any]) -> BlendRequest:
        """Lay ``prompt`` out at the chunks it holds and start the engine's token stream.
        ``wrap=False``: the prompt is an already rendered chat."""
        documents = self._documents(kwargs)
        flat: BlendPrompt = blend_prompt(self.engine, prompt, self.text_index, documents,
                                         self.document_prompt, wrap=wrap)
        return requests.start(self.engine, flat, self.blend_config(**kwargs),
                              self.generation_config(stop, **kwargs),
                              self._fallback_hook(self.text_index, len(documents or ())))

    def _finish(self, request: BlendRequest) -> dict[str, Any]:
        """Record the finished request; its generation_info."""
        return self._finished(request)

    def _ls_params(self, model_type: str, stop: list[str] | None,
                   kwargs: dict[str, Any]) -> dict[str, Any]:
        model = kwargs.get("model")
        params: dict[str, Any] = {
            "ls_provider": "blendrag", "ls_model_type": model_type,
            "ls_model_name": model if isinstance(model, str) else self.engine.name,
            "ls_temperature": kwargs.get("temperature", self.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", self.max_tokens),
        }
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params
