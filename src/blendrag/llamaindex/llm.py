"""BlendLLM: a LlamaIndex ``CustomLLM`` over one :class:`~blendrag.BlendEngine`.

Every request goes through one path: split the prompt text into prefix, chunks and suffix
(at the given nodes' texts, else at the chunk texts recorded by ingestion), tokenize each
piece on its own, start the engine's token stream. ``complete`` drains the same stream that
``stream_complete`` hands out, so both produce the same text by construction.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Sequence, Union

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
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationStream, RequestStats
from blendrag.kv.keys import hash_ids
from blendrag.flat_prompt import flat_layout
from blendrag.text_index import ChunkTextIndex

DEFAULT_CHUNK_TEMPLATE = "{text}\n\n"
"""How a node is written into the prompt; its KV is computed over exactly this text."""

FULL_PREFILL = BlendConfig(mode="full")

log = logging.getLogger(__name__)

NodeLike = Union[NodeWithScore, BaseNode, str]
"""A retrieved node (formatted with the chunk template) or a chunk text taken verbatim."""


class BlendLLM(CustomLLM):
    """LlamaIndex LLM that prefills RAG prompts from cached chunk KVs (CacheBlend).

    Pass the retrieved nodes as ``nodes=`` (``BlendSynthesizer`` does) to blend at their
    exact boundaries; without them, chunk texts recorded by :class:`BlendKVTransform` (or
    by earlier ``nodes=`` requests) are found inside the flat prompt, so stock synthesizers
    blend too. A prompt without any known chunk runs as a plain full prefill.

    The engine should be built with a ``chunk_prefix`` (``from_pretrained`` uses ``""``):
    chunk KVs are then computed after that canonical prefix and can be precomputed at
    ingestion, before any query prompt exists.

    Per-call keyword arguments: ``nodes``, ``blend_config``, ``generation_config``.
    ``last_stats`` holds the last finished request's :class:`RequestStats`; every final
    response carries them in ``additional_kwargs["stats"]`` and ``raw["stats"]``.
    """

    blend_config: BlendConfig = Field(default_factory=BlendConfig, description="How prompts with chunks are prefilled.")
    generation_config: GenerationConfig = Field(
        default_factory=lambda: GenerationConfig(max_new_tokens=256), description="Decoding settings."
    )
    chunk_template: str = Field(default=DEFAULT_CHUNK_TEMPLATE, description="A node's prompt text; must contain {text}.")

    _engine: BlendEngine = PrivateAttr()
    _text_index: ChunkTextIndex = PrivateAttr()
    _last_stats: RequestStats | None = PrivateAttr(default=None)
    # ChunkTextIndex is a plain dict of sets: async requests (worker threads) may search it
    # while ingestion or another request adds texts.

    def __init__(self, engine: BlendEngine, *, text_index: ChunkTextIndex | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if "{text}" not in self.chunk_template:
            raise ValueError(f"chunk_template must contain '{{text}}', got {self.chunk_template!r}")
        self._engine = engine
        self._text_index = text_index if text_index is not None else ChunkTextIndex()

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "float32", device: str | None = None, store: Any = None,
                        chat: bool | None = None, system: str | None = None, chunk_prefix: str = "",
                        text_index: ChunkTextIndex | None = None, **kwargs: Any) -> "BlendLLM":
        """Load a local model directory into a new engine (``chunk_prefix`` defaults to ``""``)."""
        engine = BlendEngine.from_pretrained(path, dtype=dtype, device=device, store=store, chat=chat,
                                             system=system, chunk_prefix=chunk_prefix)
        return cls(engine, text_index=text_index, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "BlendLLM"

    @property
    def engine(self) -> BlendEngine:
        """The engine every request runs on."""
        return self._engine

    @property
    def text_index(self) -> ChunkTextIndex:
        """Chunk texts found in flat prompts (shared with :class:`BlendKVTransform`)."""
        return self._text_index

    @property
    def last_stats(self) -> RequestStats | None:
        """Stats of the last finished request (a stream finishes when exhausted)."""
        return self._last_stats

    @property
    def metadata(self) -> LLMMetadata:
        engine = self._engine
        return LLMMetadata(
            context_window=engine.adapter.max_positions,
            num_output=self.generation_config.max_new_tokens,
            is_chat_model=engine.prompts.chat,
            model_name=engine.name,
        )

    # ---- chunks ------------------------------------------------------------------------------

    def format_chunk(self, text: str) -> str:
        """``text`` written into the prompt with the chunk template."""
        # replace, not str.format: templates and texts may contain other braces
        return self.chunk_template.replace("{text}", text)

    def chunk_text(self, node: NodeLike) -> str:
        """The exact prompt text of a node: its ``MetadataMode.LLM`` content, formatted."""
        if isinstance(node, str):
            return node
        if isinstance(node, NodeWithScore):
            node = node.node
        return self.format_chunk(node.get_content(metadata_mode=MetadataMode.LLM))

    def ingest(self, nodes: Sequence[NodeLike], *, profile: bool | int = False) -> int:
        """Precompute and store the KV of each node's chunk text and record the text for
        flat-prompt detection. Returns how many KVs were computed now (others were stored).

        ``profile``: also measure each new node's context-sensitivity profile, for blending with
        ``BlendConfig(selector="profile")`` (otherwise measured at its first query): one more
        forward per node (``profile=k``: after each of the k nodes before it, k forwards). A node
        is measured after the non-empty node before it in ``nodes`` (the first after the last), so
        pass a document's nodes in order."""
        texts = [self.chunk_text(n) for n in nodes]
        self.remember(texts)
        ids = [i for i in (self._engine.prompts.encode(t) for t in texts) if i]  # empty nodes have no KV
        return sum(self._engine.precompute(self._chunk_prefix_ids(), ids, profile=profile))

    def cached(self, nodes: Sequence[NodeLike]) -> list[bool]:
        """Whether each node's chunk KV is in the engine's store now."""
        engine, prefix = self._engine, self._chunk_prefix_ids()
        return [engine.store.contains(engine.key(prefix, engine.prompts.encode(self.chunk_text(n)))) for n in nodes]

    def remember(self, texts: Sequence[str]) -> None:
        """Record chunk texts in the text index, formatted and bare: the last chunk of a stock
        synthesizer's prompt lacks the template's tail, and so may a chat template's trimmed
        message content."""
        for text in self._variants(texts):
            if text not in self._text_index:
                self._text_index.add(text)

    def _variants(self, texts: Sequence[str]) -> list[str]:
        return [v for t in texts for v in dict.fromkeys((t, self._bare(t))) if v]

    @property
    def kv_identity(self) -> str:
        """Hash of what a chunk KV depends on besides the node (model, tokenizer, chunk prefix,
        chunk template): the ingestion transform's cache identity."""
        engine = self._engine
        parts = (engine.model_fp, engine.tokenizer_fp, hash_ids(self._chunk_prefix_ids()), self.chunk_template)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def _bare(self, text: str) -> str:
        head, _, tail = self.chunk_template.partition("{text}")
        if text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail):
            return text[len(head):len(text) - len(tail)]
        return text

    def _chunk_prefix_ids(self) -> list[int]:
        prompts = self._engine.prompts
        if prompts.chunk_prefix is None:
            raise ValueError("chunk KVs precomputed before any prompt exists need a canonical prefix: build the "
                             "engine with chunk_prefix (e.g. BlendEngine(..., chunk_prefix='')) or use "
                             "BlendLLM.from_pretrained")
        return prompts.chunk_prefix_ids()

    # ---- requests ----------------------------------------------------------------------------

    def _start(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> GenerationStream:
        """The one prompt-building path: split at the nodes' texts (else the ingested texts),
        tokenize piece by piece, start the engine's stream. ``formatted``: the prompt already
        has the chat template."""
        nodes = kwargs.get("nodes")
        texts = None
        if nodes is not None:
            texts = [self.chunk_text(n) for n in nodes]
            self.remember(texts)  # later flat prompts find them even if ingestion was skipped
        flat = flat_layout(self._engine.prompts, prompt, self._text_index, texts=texts, wrap=not formatted)
        if texts and flat.matched < len(texts):
            log.debug("%d of %d nodes not found verbatim in the prompt", len(texts) - flat.matched, len(texts))
        config = FULL_PREFILL if flat.full_only else kwargs.get("blend_config") or self.blend_config
        generation = kwargs.get("generation_config") or self.generation_config
        return self._engine.stream(flat.layout, config, generation)

    def _responses(self, stream: GenerationStream) -> CompletionResponseGen:
        """One response per text delta, then a final one (empty delta) carrying the stats."""
        text = ""
        for delta in stream:
            text += delta
            yield CompletionResponse(text=text, delta=delta)
        result = stream.result
        self._last_stats = result.stats
        stats = result.stats.to_dict()
        raw = {"token_ids": list(result.token_ids), "finish_reason": result.finish_reason, "stats": stats}
        yield CompletionResponse(text=result.text, delta="", raw=raw, additional_kwargs={"stats": stats})

    def _complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        last = None
        for last in self._responses(self._start(prompt, formatted, kwargs)):
            pass
        return last

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> tuple[str, bool]:
        """(prompt, formatted): the tokenizer's chat template when the engine uses one."""
        prompts = self._engine.prompts
        if not prompts.chat:
            return self.messages_to_prompt(messages), False
        rendered = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        if prompts.system is not None and not any(m.role == MessageRole.SYSTEM for m in messages):
            rendered.insert(0, {"role": "system", "content": prompts.system})
        text = self._engine.tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
        return text, True

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Generate a completion. ``formatted=True``: the prompt already has the chat template."""
        return self._complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
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
        return stream_completion_response_to_chat_response(self._responses(self._start(prompt, formatted, kwargs)))

    # Prefill and decode steps block for their whole duration: the async variants run them in
    # a worker thread so that the event loop stays free meanwhile.

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete` (runs in a worker thread)."""
        return await asyncio.to_thread(self._complete, prompt, formatted, kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete` (prefill and each decode step in a worker thread)."""
        stream = await asyncio.to_thread(self._start, prompt, formatted, kwargs)
        return _in_thread(self._responses(stream))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`."""
        prompt, formatted = self._chat_prompt(messages)
        response = await asyncio.to_thread(self._complete, prompt, formatted, kwargs)
        return completion_response_to_chat_response(response)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`."""
        prompt, formatted = self._chat_prompt(messages)
        stream = await asyncio.to_thread(self._start, prompt, formatted, kwargs)
        return astream_completion_response_to_chat_response(_in_thread(self._responses(stream)))


async def _in_thread(responses: Iterator[CompletionResponse]) -> AsyncIterator[CompletionResponse]:
    """Async iteration over a blocking iterator, each step in a worker thread."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, responses, done)
        if item is done:
            return
        yield item
