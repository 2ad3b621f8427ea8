"""LangChain's completion LLM (``BlendLLM``) and chat model (``ChatBlend``) over one
``BlendClient``: each only translates LangChain's side of a request (kwargs, Documents,
messages, generation info, callbacks, tracing params) to the client's calls."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseLLM
from langchain_core.language_models.base import LangSmithParams
from langchain_core.outputs import (
    Generation,
    GenerationChunk,
    LLMResult,
)
from langchain_core.prompts import PromptTemplate, format_document
from langchain_core.runnables import Runnable
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
from blendrag.serving import scheduler_for
from blendrag.spec import EngineSpec, spec_fields
from blendrag.store.protocol import KVStore

log = logging.getLogger(__name__)

_SERVED: ContextVar[bool] = ContextVar("blendrag_served", default=False)
"""Set while LangChain's ``batch`` runs: its requests (each ``invoke`` in a worker thread, which
copies this context) are served by the engine's scheduler, together."""

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


def _all_at_once(config: Any, n: int, room: int) -> Any:
    """LangChain's batch ``config`` with ``max_concurrency`` ``n`` where it gives none: every
    input one thread, all of them queued on the scheduler at once (its ``max_seqs`` bounds
    those that decode together), not a thread pool's default of a few; never more than
    ``room``, the scheduler's queue (``ServingConfig.max_queue``), so that a batch larger than
    the queue waits for it rather than failing its last inputs with ``QueueFull``."""
    if isinstance(config, list):
        return [_all_at_once(c, n, room) for c in config]
    config = dict(config or {})
    asked = config.get("max_concurrency")
    config["max_concurrency"] = max(1, min(n if asked is None else asked, room))
    return config


def unbound(llm: Any) -> Any:
    """The LLM a ``RunnableBinding`` (``.bind``, ``.with_config``, ``.with_retry``) wraps,
    else ``llm``: what a type check looks at."""
    while isinstance(getattr(llm, "bound", None), Runnable):
        llm = llm.bound
    return llm


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

    def get_token_ids(self, text: str) -> list[int]:
        """``text``'s ids in the engine's own tokenizer: what LangChain counts tokens with
        (map_reduce chains, ``trim_messages``, token-buffer memories), where its default loads
        GPT-2's tokenizer from the hub."""
        if self.engine.prompts is None:
            raise ValueError("this engine has no tokenizer to count tokens with")
        return self.engine.prompts.encode(text)

    def _params(self) -> dict[str, Any]:
        return {"model": self.engine.name, **self.settings(),
                "document_prompt": self.document_prompt}

    def batch(self, inputs: list[Any], config: Any = None, *, return_exceptions: bool = False,
              **kwargs: Any) -> list[Any]:
        """LangChain's ``batch``, every request served by the engine's scheduler: the requests
        share its batched decoding steps (blendrag.serving) instead of each running alone. Each
        input is its own ``invoke`` (Runnable's ``batch``, not BaseLLM's one ``generate`` for
        all), so that an input's error (a timeout, a full queue) is its own and every other
        input keeps its answer."""
        token = _SERVED.set(True)
        try:
            return Runnable.batch(self,  # type: ignore[arg-type]  # mixed into a Runnable
                                  inputs, _all_at_once(config, len(inputs), self._room()),
                                  return_exceptions=return_exceptions, **kwargs)
        finally:
            _SERVED.reset(token)

    async def abatch(self, inputs: list[Any], config: Any = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """LangChain's ``abatch``: each input its own ``ainvoke`` (served by the scheduler,
        awaited on this event loop), so that its error is its own and cancelling the batch
        cancels every request in it."""
        return await Runnable.abatch(self,  # type: ignore[arg-type]  # mixed into a Runnable
                                     inputs, _all_at_once(config, len(inputs), self._room()),
                                     return_exceptions=return_exceptions, **kwargs)

    def _room(self) -> int:
        """How many requests the scheduler of this engine's model queues at most."""
        return scheduler_for(self.engine).config.max_queue

    def _start(self, prompt: str, templated: bool, stop: Sequence[str] | None,
               kwargs: dict[str, Any], served: bool = False) -> BlendRequest:
        """Lay ``prompt`` out at the chunks it holds and start its token stream: in this thread,
        or ``served`` by the engine's scheduler (the batch and async paths)."""
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
                            strict=strict_from(kwargs, self.strict),
                            served=served or _SERVED.get())

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
        if len(prompts) > 1 or _SERVED.get():  # LangChain's batch: served together
            requests = self._start_all(prompts, stop, kwargs)
            with _cancelled_on_error(requests):
                generations = [[self._collect(r, callbacks)] for r in requests]
        else:
            chunks = list(self._stream(prompts[0], stop, callbacks, **kwargs))
            text = "".join(c.text for c in chunks)
            generations = [[Generation(text=text, generation_info=chunks[-1].generation_info)]]
        return LLMResult(generations=generations, llm_output={"model_name": self.engine.name})

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> LLMResult:
        """Every prompt served by the engine's scheduler, awaited on this event loop (no thread
        per call)."""
        callbacks = run_manager if self.streaming else None
        requests = self._start_all(prompts, stop, kwargs)
        generations = []
        with _cancelled_on_error(requests):
            for request in requests:
                text = ""
                async for delta in request.served:
                    text += delta
                    if callbacks is not None:
                        await callbacks.on_llm_new_token(delta, chunk=GenerationChunk(text=delta))
                info = self._client.finish(request)
                generations.append([Generation(text=text, generation_info=info)])
        return LLMResult(generations=generations, llm_output={"model_name": self.engine.name})

    def _start_all(self, prompts: list[str], stop: list[str] | None,
                   kwargs: dict[str, Any]) -> list[BlendRequest]:
        """Every prompt queued on the scheduler; those queued already are cancelled when one
        cannot start."""
        requests: list[BlendRequest] = []
        try:
            for prompt in prompts:
                requests.append(self._start(prompt, False, stop, dict(kwargs), served=True))
        except BaseException:
            for request in requests:
                request.served.cancel()
            raise
        return requests

    def _collect(self, request: BlendRequest,
                 callbacks: CallbackManagerForLLMRun | None) -> Generation:
        text = ""
        for delta in request.stream:
            text += delta
            if callbacks is not None:
                callbacks.on_llm_new_token(delta, chunk=GenerationChunk(text=delta))
        return Generation(text=text, generation_info=self._client.finish(request))

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

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        """:meth:`_stream` served by the engine's scheduler, awaited on this event loop."""
        request = self._start(prompt, False, stop, kwargs, served=True)
        async for delta in request.served:
            chunk = GenerationChunk(text=delta)
            if run_manager is not None:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield GenerationChunk(text="", generation_info=self._client.finish(request))


@contextmanager
def _cancelled_on_error(requests: list[BlendRequest]) -> Iterator[None]:
    """Read ``requests`` one after another: when one fails or the caller goes away (a
    cancelled task), those not read yet are cancelled too, freeing their slots and blocks."""
    try:
        yield
    except BaseException:
        for request in requests:
            request.served.cancel()  # a no-op for those done
        raise
