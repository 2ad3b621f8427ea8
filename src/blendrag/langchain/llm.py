"""LangChain's completion LLM (``BlendLLM``) and chat model (``ChatBlend``) over one
``BlendClient``: each only translates LangChain's side of a request (kwargs, Documents,
messages, generation info, callbacks, tracing params) to the client's calls."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseLLM
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import (
    ChatGenerationChunk,
    ChatResult,
    Generation,
    GenerationChunk,
    LLMResult,
)
from langchain_core.prompts import PromptTemplate, format_document
from pydantic import Field, PrivateAttr, field_validator, model_validator
from typing_extensions import Self

from blendrag.engine import BlendEngine
from blendrag.integration.client import BlendClient, BlendRequest, ClientViews
from blendrag.integration.fallback import FallbackFixes
from blendrag.integration.settings import (
    BlendSettings,
    namespace_from,
    overrides_from,
    strict_from,
    warn_unknown,
)
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.spec import EngineSpec, spec_fields
from blendrag.store.protocol import KVStore

log = logging.getLogger(__name__)

FIXES = FallbackFixes(
    empty_index="ingest through BlendChroma.from_documents(docs, embedding=..., llm=llm), or open "
                "an existing collection with BlendChroma(..., llm=llm), which records its texts; "
                "a prompt without retrieved passages is a full prefill by design "
                "({llm}(..., mode='full') says so and is not warned about)",
    not_in_prompt="a prompt without retrieved passages is a full prefill by design ({llm}(..., "
                  "mode='full') says so and is not warned about); if the prompt does hold "
                  "retrieved Documents, the chain writes them differently from document_prompt: "
                  "give {llm}(..., document_prompt=...) the chain's document prompt",
    documents_not_in_prompt="give {llm}(..., document_prompt=...) the chain's document prompt, "
                            "the spelling of each Document in the prompt",
    not_ingested="ingest the documents through BlendChroma (BlendChroma.from_documents(docs, "
                 "embedding=..., llm=llm), or BlendChroma(..., llm=llm).add_documents(docs)), "
                 "which precomputes their KVs",
)

# Keyword arguments LangChain itself may pass down to _generate/_stream: not ours, not an error.
_LANGCHAIN_KEYS = frozenset({"stream", "model", "ls_structured_output_format"})
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
          "function": "function"}


def format_documents(documents: Sequence[Document], document_prompt: str) -> list[str]:
    """Each Document as the prompt spells it (LangChain's ``format_document``)."""
    template = PromptTemplate.from_template(document_prompt)
    return [format_document(doc, template) for doc in documents]


class BlendParams(ClientViews, BlendSettings):
    """What :class:`BlendLLM` and :class:`ChatBlend` share: the flat settings (``mode``,
    ``selector``, ``ratio``, ``max_tokens``, ...; :class:`BlendSettings`), the engine and text
    index, and the request path. Per call, ``documents=`` (the retrieved Documents) and any
    setting may be passed as keyword arguments (``invoke(..., documents=docs)`` or
    ``.bind(...)``)."""

    engine: BlendEngine = Field(exclude=True)
    """The engine (model, tokenizer, chunk-KV store). Give it a ``chunk_prefix`` so that KVs
    precomputed at ingestion match the chains' prompts."""
    text_index: ChunkTextIndex | None = Field(default=None, exclude=True)
    """Chunk texts recorded at ingestion; used to find chunks in a flat prompt. Default: kept
    with the engine's KV store when it has a disk tier (``<disk_dir>/text_index``), else in
    memory."""
    document_prompt: str = "{page_content}"
    """How the chain formats one Document into the prompt (``create_stuff_documents_chain``'s
    ``document_prompt``); the chunk text located in the prompt and recorded at ingestion."""
    streaming: bool = False
    """Route ``invoke`` through the token stream so callbacks get every token."""

    _client: BlendClient = PrivateAttr()

    @field_validator("engine", mode="before")
    @classmethod
    def _an_engine(cls, engine: Any) -> Any:
        """A model name where the engine goes gets the same hint as in LlamaIndex (pydantic's
        own error would only say the type is wrong)."""
        if isinstance(engine, str):
            raise TypeError(f"engine must be a BlendEngine, got str (build one: "
                            f"BlendEngine.from_pretrained({engine!r}))")
        return engine

    @model_validator(mode="after")
    def _make_client(self) -> BlendParams:
        self._check_configs()
        self._new_client()
        return self

    @classmethod
    def from_pretrained(cls, path: str | Path, *, store: KVStore | None = None,
                        **kwargs: Any) -> Self:
        """Load a model (a short name, a folder, a GGUF file or a hub id) into a new engine.
        ``kwargs``: the engine's (``EngineSpec`` fields: ``dtype``, ``device``, ``chat``,
        ``prefix_cache_bytes``, ...; ``chunk_prefix`` defaults to ``""``) and this LLM's
        (``ratio``, ``max_tokens``, ``text_index``, ...); ``store``: an open store (else the
        spec's)."""
        engine_kwargs, llm_kwargs = spec_fields(kwargs)
        spec = EngineSpec(model=str(path), **{"chunk_prefix": "", **engine_kwargs})
        return cls.from_spec(spec, store=store, **llm_kwargs)

    @classmethod
    def from_spec(cls, spec: EngineSpec, *, store: KVStore | None = None,
                  **kwargs: Any) -> Self:
        """A new engine built from ``spec`` (``store``: an open store instead of the spec's);
        ``kwargs``: this LLM's settings."""
        return cls(engine=spec.build(store), **kwargs)

    def _new_client(self) -> None:
        """A client of this LLM's engine and text index, with no request of its own yet."""
        self._client = BlendClient(self.engine, self.text_index, fixes=FIXES,
                                   name=type(self).__name__, namespace=self.namespace)
        self.text_index = self._client.text_index

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False):
        """A copy (with ``update``, which may name another engine or text index) with its own
        last request."""
        copy = super().model_copy(update=update, deep=deep)
        copy._new_client()
        return copy

    def _params(self) -> dict[str, Any]:
        return {"model": self.engine.name, **self.settings(),
                "document_prompt": self.document_prompt}

    def _start(self, prompt: str, templated: bool, stop: Sequence[str] | None,
               kwargs: dict[str, Any]) -> BlendRequest:
        """Lay ``prompt`` out at the chunks it holds and start the engine's token stream."""
        warn_unknown(type(self).__name__, kwargs, {"documents", *_LANGCHAIN_KEYS})
        docs = kwargs.get("documents")
        if docs is not None and not all(isinstance(d, Document) for d in docs):
            raise TypeError("documents= must be a list of langchain Document objects")
        overrides, stops = overrides_from(kwargs)
        texts = format_documents(docs, self.document_prompt) if docs else None
        client = self._client.serving(namespace_from(kwargs, self.namespace))
        return client.start(prompt, self.blend_config(**overrides),
                            self.generation_config([*(stop or ()), *stops], **overrides),
                            texts=texts, templated=templated,
                            strict=strict_from(kwargs, self.strict))

    def _ls_params(self, model_type: str, stop: list[str] | None,
                   kwargs: dict[str, Any]) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider="blendrag", ls_model_type="chat" if model_type == "chat" else "llm",
            ls_model_name=model if isinstance(model, str) else self.engine.name,
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens))
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params


class BlendLLM(BlendParams, BaseLLM):
    """LangChain ``BaseLLM`` over a :class:`~blendrag.BlendEngine`.

    The prompt string is split into prefix / chunks / suffix at the retrieved chunk texts:
    the Documents given as ``documents=`` (formatted with ``document_prompt``), else the texts
    recorded in ``text_index`` at ingestion (stock chains pass only the flat prompt). Cached
    chunk KVs are blended (``mode``/``selector``/``ratio``); a prompt without any known chunk
    gets a plain full prefill. With a chat-template engine the prompt is the user message.

    >>> llm = BlendLLM(engine=BlendEngine.from_pretrained(path, chunk_prefix=""), ratio=0.2)
    >>> llm.invoke(prompt, documents=docs)
    >>> llm.last_stats.cache.chunk_hits
    """

    @property
    def _llm_type(self) -> str:
        return "blendrag"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._params()

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return self._ls_params("llm", stop, kwargs)

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        # The token stream is the only generation path: invoke == stream by construction.
        callbacks = run_manager if self.streaming else None
        generations = []
        for prompt in prompts:
            chunks = list(self._stream(prompt, stop, callbacks, **kwargs))
            text = "".join(c.text for c in chunks)
            generations.append([Generation(text=text, generation_info=chunks[-1].generation_info)])
        return LLMResult(generations=generations, llm_output={"model_name": self.engine.name})

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:
        request = self._start(prompt, False, stop, kwargs)
        for delta in request.stream:
            chunk = GenerationChunk(text=delta)
            # BaseLLM.stream does not report tokens to callbacks: each text chunk is reported
            # here, and only those (the final chunk below carries metadata, not a token).
            if run_manager is not None:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield GenerationChunk(text="", generation_info=self._client.finish(request))


class ChatBlend(BlendParams, BaseChatModel):
    """LangChain ``BaseChatModel`` over a :class:`~blendrag.BlendEngine` (instruct models).

    The messages are rendered with the tokenizer's chat template (the engine's ``system``
    message is added when the conversation has none); the rendered text is split at the
    retrieved chunk texts exactly as :class:`BlendLLM` splits a prompt: the Documents given
    as ``documents=``, else the texts of ``text_index``. The answer's ``usage_metadata``
    counts prompt and new tokens; ``response_metadata["blendrag"]`` holds the request stats.
    """

    @model_validator(mode="after")
    def _check_template(self) -> ChatBlend:
        if not getattr(self.engine.tokenizer, "chat_template", None):
            raise ValueError("ChatBlend needs a tokenizer with a chat_template; use BlendLLM for "
                             "this model")
        return self

    @property
    def _llm_type(self) -> str:
        return "blendrag-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._params()

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return self._ls_params("chat", stop, kwargs)

    def render(self, messages: list[BaseMessage]) -> str:
        """The conversation as the model reads it (chat template, assistant header last)."""
        return self._client.render_chat([{"role": _role(m), "content": str(m.text)}
                                         for m in messages])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        # The token stream is the only generation path: invoke == stream by construction.
        # (BaseChatModel itself reports streamed tokens to callbacks.)
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        request = self._start(self.render(messages), True, stop, kwargs)
        # BaseChatModel reports every chunk to on_llm_new_token (and adds an empty "last" chunk,
        # reported too, when ours is not marked last): the final metadata rides on the last text
        # delta, so each delta is handed out once the next one is known (one decode step later)
        # and callbacks count exactly the text chunks.
        held: str | None = None
        for delta in request.stream:
            if held is not None:
                yield ChatGenerationChunk(message=AIMessageChunk(content=held))
            held = delta
        info = self._client.finish(request)
        stats = request.result.stats
        prompt, new = stats.prompt.tokens, stats.decode.new_tokens
        usage = UsageMetadata(input_tokens=prompt, output_tokens=new, total_tokens=prompt + new)
        last = AIMessageChunk(content=held or "", usage_metadata=usage, chunk_position="last",
                              response_metadata={"model_name": self.engine.name,
                                                 "model_provider": "blendrag"})
        yield ChatGenerationChunk(message=last, generation_info=info)


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        return message.role
    if message.type not in _ROLES:
        raise ValueError(f"ChatBlend cannot render a {message.type!r} message")
    return _ROLES[message.type]
