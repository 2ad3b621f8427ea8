"""BlendLLM: a LangChain completion LLM whose prefill blends cached chunk KVs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.language_models.base import LangSmithParams
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from blendrag.langchain._base import BlendParams


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
        return LangSmithParams(**self._ls_params("llm", stop, kwargs))

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
        request = self._start(prompt, True, stop, kwargs)
        for delta in request.stream:
            chunk = GenerationChunk(text=delta)
            # BaseLLM.stream does not report tokens to callbacks: each text chunk is reported
            # here, and only those (the final chunk below carries metadata, not a token).
            if run_manager is not None:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield GenerationChunk(text="", generation_info=self._finish(request))
