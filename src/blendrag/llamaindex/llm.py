"""BlendLLM: a LlamaIndex ``CustomLLM`` over one :class:`~blendrag.BlendEngine`.

Every request goes through the framework-neutral core (``blendrag.integration``): split the
prompt text into prefix, chunks and suffix (at the given nodes' texts, else at the chunk texts
recorded by ingestion), tokenize each piece on its own, start the engine's token stream.
``complete`` drains the same stream that ``stream_complete`` hands out, so both produce the same
text by construction. This module translates LlamaIndex's types: nodes to chunk texts, chat
messages to turns, the stream to ``CompletionResponse`` objects.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.llms.generic_utils import (
    astream_completion_response_to_chat_response,
    completion_response_to_chat_response,
    stream_completion_response_to_chat_response,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from blendrag.engine import BlendEngine
from blendrag.integration.chunks import DEFAULT_CHUNK_TEMPLATE, DEFAULT_SEPARATOR, ChunkFormat
from blendrag.integration.client import BlendClient, BlendRequest, ClientViews
from blendrag.integration.fallback import FallbackFixes
from blendrag.integration.settings import (
    BlendSettings,
    fields_from_configs,
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
    empty_index="pass BlendKVTransform(llm) among the transformations that build the index, "
                "after the splitter (VectorStoreIndex.from_documents(docs, transformations=[...]) "
                "or an IngestionPipeline's), or run BlendKVTransform(llm)(nodes) on its nodes "
                "(an IngestionPipeline whose docstore skipped documents an earlier process "
                "ingested: keep the KVs and texts in a persistent store, a TieredKVStore with "
                "a disk tier, which a new process finds); a prompt without retrieved "
                "passages is a full prefill by design ({llm}(..., mode='full') or "
                "complete(..., mode='full') says so and is not warned about)",
    not_in_prompt="a prompt without retrieved passages is a full prefill by design ({llm}(..., "
                  "mode='full') or complete(..., mode='full') says so and is not warned about); "
                  "if the prompt does hold retrieved nodes, the synthesizer writes them "
                  "differently from chunk_template: answer with blend_query_engine(index, llm), "
                  "or set chunk_template to the synthesizer's",
    documents_not_in_prompt="pass nodes= as the prompt writes them (the chunk_template "
                            "formats each node)",
    not_ingested="precompute the nodes' KVs when they are indexed: BlendKVTransform(llm) among "
                 "the transformations of the IngestionPipeline or VectorStoreIndex that builds "
                 "the index, after the splitter (or BlendKVTransform(llm)(nodes) on its nodes)",
)

NodeLike = NodeWithScore | BaseNode | str
"""A retrieved node (formatted with the chunk template) or a chunk text taken verbatim."""


class BlendLLM(ClientViews, BlendSettings, CustomLLM):
    """LlamaIndex LLM that prefills RAG prompts from cached chunk KVs (CacheBlend).

    Pass the retrieved nodes as ``nodes=`` (``BlendSynthesizer`` does) to blend at their
    exact boundaries; without them, chunk texts recorded by :class:`BlendKVTransform` (or
    by earlier ``nodes=`` requests) are found inside the flat prompt, so stock synthesizers
    blend too. A prompt without any known chunk runs as a plain full prefill.

    The engine should be built with a ``chunk_prefix`` (``from_pretrained`` uses ``""``):
    chunk KVs are then computed after that canonical prefix and can be precomputed at
    ingestion, before any query prompt exists.

    Settings are the flat fields both integrations share (``mode``, ``selector``, ``ratio``,
    ``max_tokens``, ...; :class:`~blendrag.integration.settings.BlendSettings`);
    ``blend_config=`` and ``generation_config=`` (config objects) fill them, at construction
    and per call. Per-call keyword arguments: ``nodes``, ``blend_config``,
    ``generation_config`` and any flat field. ``last_stats`` holds the last finished
    request's :class:`RequestStats`; every final response carries ``blended`` (False: a plain
    full prefill), ``stats`` (mode, chunk hits/misses, recompute fraction, TTFT, ...) and
    ``prompt`` (chunks matched, fallback cause) in ``raw`` and ``additional_kwargs`` (so
    callback handlers see them in the response). ``strict=True`` raises instead of falling
    back to a full prefill.
    """

    chunk_template: str = Field(default=DEFAULT_CHUNK_TEMPLATE,
                                description="A node's prompt text; must contain {text}.")
    chunk_separator: str = Field(default=DEFAULT_SEPARATOR,
                                 description="What goes between two chunks of a prompt.")

    _client: BlendClient = PrivateAttr()

    def __init__(self, engine: BlendEngine, *, text_index: ChunkTextIndex | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # a template without {text} is refused
        chunk_format = ChunkFormat(self.chunk_template, self.chunk_separator)
        self._client = BlendClient(engine, text_index, chunk_format, fixes=FIXES,
                                   name=type(self).__name__, namespace=self.namespace)

    @model_validator(mode="before")
    @classmethod
    def _config_objects(cls, data: Any) -> Any:
        """``blend_config=`` / ``generation_config=`` objects fill the flat fields (explicit flat
        fields win)."""
        if isinstance(data, dict) and ("blend_config" in data or "generation_config" in data):
            data = dict(data)
            data = {**fields_from_configs(data.pop("blend_config", None),
                                          data.pop("generation_config", None)), **data}
        return data

    @model_validator(mode="after")
    def _check_settings(self) -> BlendLLM:
        self._check_configs()
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False):
        """A copy (with ``update``), on the same engine and index, with its own last request."""
        copy = super().model_copy(update=update, deep=deep)
        copy._client = self._client.fork(ChunkFormat(copy.chunk_template, copy.chunk_separator))
        return copy

    @classmethod
    def from_pretrained(cls, path: str | Path, *, text_index: ChunkTextIndex | None = None,
                        store: KVStore | None = None, **kwargs: Any) -> BlendLLM:
        """Load a model (a short name, a folder, a GGUF file or a hub id) into a new engine.
        ``kwargs``: the engine's (``EngineSpec`` fields: ``dtype``, ``device``, ``chat``,
        ``prefix_cache_bytes``, ...; ``chunk_prefix`` defaults to ``""``) and this LLM's
        (``ratio``, ``max_tokens``, ...); ``store``: an open store (else the spec's)."""
        engine_kwargs, llm_kwargs = spec_fields(kwargs)
        spec = EngineSpec(model=str(path), **{"chunk_prefix": "", **engine_kwargs})
        return cls.from_spec(spec, text_index=text_index, store=store, **llm_kwargs)

    @classmethod
    def from_spec(cls, spec: EngineSpec, *, text_index: ChunkTextIndex | None = None,
                  store: KVStore | None = None, **kwargs: Any) -> BlendLLM:
        """A new engine built from ``spec`` (``store``: an open store instead of the spec's);
        ``kwargs``: this LLM's settings."""
        return cls(spec.build(store), text_index=text_index, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "BlendLLM"

    @property
    def engine(self) -> BlendEngine:
        """The engine every request runs on."""
        return self._client.engine

    @property
    def text_index(self) -> ChunkTextIndex:
        """Chunk texts found in flat prompts (shared with :class:`BlendKVTransform`)."""
        return self._client.text_index

    @property
    def metadata(self) -> LLMMetadata:
        engine = self.engine
        return LLMMetadata(context_window=engine.adapter.max_positions, num_output=self.max_tokens,
                           is_chat_model=self._client.prompts.chat, model_name=engine.name)

    def chunk_text(self, node: NodeLike) -> str:
        """The exact prompt text of a node: its ``MetadataMode.LLM`` content in the chunk
        template (a str is taken as the chunk text itself)."""
        if isinstance(node, str):
            return node
        if isinstance(node, NodeWithScore):
            node = node.node
        if not isinstance(node, BaseNode):
            raise TypeError(f"nodes= takes LlamaIndex nodes (TextNode, NodeWithScore) or chunk "
                            f"texts (str), got a {type(node).__name__}")
        return self._client.chunk_format.format(node.get_content(metadata_mode=MetadataMode.LLM))

    # ---- requests ----------------------------------------------------------------------------

    def _start(self, prompt: str, formatted: bool, kwargs: dict[str, Any],
               served: bool = False) -> BlendRequest:
        """Split at the nodes' texts (else the ingested texts), tokenize piece by piece, start
        the engine's stream (``served``: queue it on the engine's scheduler). ``formatted``:
        the prompt already has the chat template."""
        warn_unknown(type(self).__name__, kwargs, {"nodes"})
        nodes = kwargs.get("nodes")
        if nodes is not None and not isinstance(nodes, (list, tuple)):
            raise TypeError(f"nodes= takes a list of the retrieved nodes (or chunk texts), got a "
                            f"{type(nodes).__name__}")
        texts = [self.chunk_text(n) for n in nodes] if nodes is not None else None
        overrides, stop = overrides_from(kwargs)
        client = self._client.serving(namespace_from(kwargs, self.namespace))
        return client.start(prompt, self.blend_config(**overrides),
                            self.generation_config(stop, **overrides), texts=texts,
                            templated=formatted, strict=strict_from(kwargs, self.strict),
                            served=served)

    def _responses(self, request: BlendRequest) -> CompletionResponseGen:
        """One response per text delta, then a final one (empty delta) carrying the stats."""
        text = ""
        for delta in request.stream:
            text += delta
            yield CompletionResponse(text=text, delta=delta)
        yield self._final(request)

    def _final(self, request: BlendRequest) -> CompletionResponse:
        """The final response (empty delta): the whole text, the tokens and the stats."""
        info = self._client.finish(request)
        result = request.result
        meta = {"blended": info["blended"], "stats": info["blendrag"],
                "prompt": info["blendrag_prompt"]}
        raw = {"token_ids": list(result.token_ids), "finish_reason": result.finish_reason, **meta}
        return CompletionResponse(text=result.text, delta="", raw=raw, additional_kwargs=meta)

    def _complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        *_, last = self._responses(self._start(prompt, formatted, kwargs))  # drain the stream
        return last

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> tuple[str, bool]:
        """(prompt, formatted): the tokenizer's chat template when the engine uses one."""
        if not self._client.prompts.chat:
            return self.messages_to_prompt(messages), False  # type: ignore[misc]  # a pydantic field
        turns = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        return self._client.render_chat(turns), True

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Generate a completion. ``formatted=True``: the prompt already has the chat template."""
        return self._complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        """Like :meth:`complete`, one response per text delta (prefill runs now)."""
        return self._responses(self._start(prompt, formatted, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Chat through the tokenizer's chat template (``nodes=`` as for :meth:`complete`)."""
        prompt, formatted = self._chat_prompt(messages)
        return completion_response_to_chat_response(self._complete(prompt, formatted, kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Streaming :meth:`chat`."""
        prompt, formatted = self._chat_prompt(messages)
        return stream_completion_response_to_chat_response(
            self._responses(self._start(prompt, formatted, kwargs))
        )

    # The async variants are served by the engine's scheduler (blendrag.serving): every
    # request in flight shares its batched decoding steps, and each is awaited on the caller's
    # event loop, with no thread per call.

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete`, served with every other request in flight."""
        request = self._start(prompt, formatted, kwargs, served=True)
        async for _ in request.served:  # the text deltas: the final response has them all
            pass
        return self._final(request)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`, served with every other request in flight."""
        return self._aresponses(self._start(prompt, formatted, kwargs, served=True))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`, served with every other request in flight."""
        prompt, formatted = self._chat_prompt(messages)
        response = await self.acomplete(prompt, formatted, **kwargs)
        return completion_response_to_chat_response(response)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage],
                           **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`, served with every other request in flight."""
        prompt, formatted = self._chat_prompt(messages)
        return astream_completion_response_to_chat_response(
            self._aresponses(self._start(prompt, formatted, kwargs, served=True)))

    def _aresponses(self, request: BlendRequest) -> CompletionResponseAsyncGen:
        """:meth:`_responses` of a served request, on the event loop. The request is
        submitted already (a bad one raised at the call): if its responses are dropped before
        they are read, it is cancelled, so that it frees its slot and blocks (one dropped while
        it is read is cancelled by its handle)."""
        responses = self._served_responses(request)
        weakref.finalize(responses, request.served.cancel)  # a no-op once it is done
        return responses

    async def _served_responses(self, request: BlendRequest) -> CompletionResponseAsyncGen:
        text = ""
        async for delta in request.served:
            text += delta
            yield CompletionResponse(text=text, delta=delta)
        yield self._final(request)
