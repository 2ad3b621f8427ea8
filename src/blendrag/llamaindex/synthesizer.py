"""BlendSynthesizer: answer from the retrieved nodes with their chunk boundaries kept.

Stock synthesizers join the node texts into one context string (COMPACT even re-splits it
to fill the context window), so the LLM sees neither which text is a node nor where one
ends. This one writes each node with the LLM's chunk template, joins them with its chunk
separator, and hands the node texts to :class:`BlendLLM` beside the prompt, one chunk KV per
node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms.llm import (
    astream_completion_response_to_tokens,
    stream_completion_response_to_tokens,
)
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers.base import BaseSynthesizer
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.types import RESPONSE_TEXT_TYPE

from blendrag.llamaindex.llm import BlendLLM

DEFAULT_QA_TEMPLATE = PromptTemplate(
    # LlamaIndex's default QA prompt, without the trailing space after "Answer:", which would
    # make the model start its answer from an unusual token.
    "Context information is below.\n"
    "---------------------\n{context_str}\n"
    "---------------------\n"
    "Given the context information and not prior knowledge, answer the query.\n"
    "Query: {query_str}\nAnswer:"
)
"""QA prompt; ``{context_str}`` is the nodes' chunk texts, joined with the LLM's chunk separator."""


class BlendSynthesizer(BaseSynthesizer):
    """Response synthesizer for :class:`BlendLLM`: one prompt, every node a cached chunk.

    Each node's chunk is ``llm.chunk_text(node)`` (its ``MetadataMode.LLM`` content in the
    chunk template), the KV that :class:`BlendKVTransform` precomputed; chunks are joined with
    the chunk separator, whose KV the transform precomputed too. ``streaming=True``
    returns a ``StreamingResponse`` whose text equals the non-streaming answer. The prompt is
    not truncated to the context window: the engine raises ``ValueError`` when it is too long.
    """

    def __init__(self, llm: BlendLLM | None = None,
                 text_qa_template: BasePromptTemplate | None = None,
                 streaming: bool = False, callback_manager: CallbackManager | None = None,
                 **kwargs: Any) -> None:
        super().__init__(llm=llm, callback_manager=callback_manager, streaming=streaming, **kwargs)
        if not isinstance(self._llm, BlendLLM):
            raise TypeError(f"BlendSynthesizer needs a BlendLLM, got {type(self._llm).__name__}")
        self._blend_llm: BlendLLM = self._llm
        self._qa_template = text_qa_template or DEFAULT_QA_TEMPLATE

    def _get_prompts(self) -> PromptDictType:
        return {"text_qa_template": self._qa_template}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "text_qa_template" in prompts:
            self._qa_template = prompts["text_qa_template"]

    def _prompt(self, query_str: str, text_chunks: Sequence[str]) -> tuple[str, list[str]]:
        """(prompt, chunk texts); ``text_chunks`` are the nodes' MetadataMode.LLM contents."""
        fmt = self._blend_llm.client.chunk_format
        chunks = [fmt.format(t) for t in text_chunks]
        return self._qa_template.format(context_str=fmt.join(chunks), query_str=query_str), chunks

    def get_response(self, query_str: str, text_chunks: Sequence[str],
                     **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """The answer (a token generator when streaming)."""
        prompt, chunks = self._prompt(query_str, text_chunks)
        if self._streaming:
            responses = self._llm.stream_complete(prompt, nodes=chunks, **response_kwargs)
            return stream_completion_response_to_tokens(responses)
        return self._llm.complete(prompt, nodes=chunks, **response_kwargs).text

    async def aget_response(self, query_str: str, text_chunks: Sequence[str],
                            **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """Async :meth:`get_response` (an async token generator when streaming)."""
        prompt, chunks = self._prompt(query_str, text_chunks)
        if self._streaming:
            responses = await self._llm.astream_complete(prompt, nodes=chunks, **response_kwargs)
            return await astream_completion_response_to_tokens(responses)
        return (await self._llm.acomplete(prompt, nodes=chunks, **response_kwargs)).text


def blend_query_engine(index_or_retriever: BaseIndex | BaseRetriever, llm: BlendLLM,
                       **kwargs: Any) -> BaseQueryEngine:
    """A query engine answering with :class:`BlendSynthesizer` over ``llm``.

    ``kwargs``: ``streaming``, ``text_qa_template`` for the synthesizer; the rest goes to
    ``index.as_query_engine`` (e.g. ``similarity_top_k``) or ``RetrieverQueryEngine``
    (e.g. ``node_postprocessors``).
    """
    synth = BlendSynthesizer(llm=llm, streaming=kwargs.pop("streaming", False),
                             text_qa_template=kwargs.pop("text_qa_template", None))
    if isinstance(index_or_retriever, BaseIndex):
        return index_or_retriever.as_query_engine(llm=llm, response_synthesizer=synth, **kwargs)
    return RetrieverQueryEngine(retriever=index_or_retriever, response_synthesizer=synth, **kwargs)

