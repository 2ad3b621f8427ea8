"""LangChain's chat model (``ChatBlend``) over one ``BlendClient``, beside the completion LLM
(llm.py) whose settings and request path it shares (``BlendParams``): it renders messages with
the tokenizer's chat template and hands the text to the same path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import model_validator

from blendrag.integration.client import BlendRequest
from blendrag.langchain.llm import BlendParams

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
          "function": "function"}


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

    def get_num_tokens_from_messages(self, messages: list[BaseMessage],
                                     tools: Sequence[Any] | None = None) -> int:
        """The tokens of the conversation as the model reads it (:meth:`render`, the chat
        template's own tokens included); ``tools`` are not rendered and not counted."""
        return len(self.get_token_ids(self.render(messages)))

    def render(self, messages: list[BaseMessage]) -> str:
        """The conversation as the model reads it (chat template, assistant header last)."""
        return self._client.render_chat([{"role": _role(m), "content": str(m.text)}
                                         for m in messages])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        # The token stream is the only generation path: invoke == stream by construction.
        # (BaseChatModel itself reports streamed tokens to callbacks.)
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))

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
        yield self._last(request, held)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        """:meth:`_stream` served by the engine's scheduler, awaited on this event loop."""
        request = self._start(self.render(messages), True, stop, kwargs, served=True)
        held: str | None = None
        async for delta in request.served:
            if held is not None:
                yield ChatGenerationChunk(message=AIMessageChunk(content=held))
            held = delta
        yield self._last(request, held)

    def _last(self, request: BlendRequest, held: str | None) -> ChatGenerationChunk:
        """The last chunk: the last text delta with the usage and the request's stats."""
        info = self._client.finish(request)
        stats = request.result.stats
        prompt, new = stats.prompt.tokens, stats.decode.new_tokens
        usage = UsageMetadata(input_tokens=prompt, output_tokens=new, total_tokens=prompt + new)
        last = AIMessageChunk(content=held or "", usage_metadata=usage, chunk_position="last",
                              response_metadata={"model_name": self.engine.name,
                                                 "model_provider": "blendrag"})
        return ChatGenerationChunk(message=last, generation_info=info)


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        return message.role
    if message.type not in _ROLES:
        raise ValueError(f"ChatBlend cannot render a {message.type!r} message")
    return _ROLES[message.type]
