"""One request of a framework LLM, framework-neutral: find the chunks in the prompt the chain
built, start the engine's token stream (a plain full prefill when no chunk is known), render a
chat with the engine's system message, and report what the request did.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationResult, GenerationStream
from blendrag.integration.flat_prompt import FlatLayout, flat_layout
from blendrag.integration.text_index import ChunkTextIndex

log = logging.getLogger(__name__)


@dataclass
class BlendRequest:
    """One running request: its prompt layout (and how its chunks were found) and the engine's
    token stream; ``result`` once the stream is exhausted."""

    prompt: FlatLayout
    stream: GenerationStream

    @property
    def result(self) -> GenerationResult:
        if self.stream.result is None:
            raise RuntimeError("the request's stream is not exhausted yet")
        return self.stream.result

    def info(self) -> dict[str, Any]:
        """What the request did: finish reason, ``RequestStats`` and how the prompt was laid out."""
        result = self.result
        return {"finish_reason": result.finish_reason, "blendrag": result.stats.to_dict(),
                "blendrag_prompt": self.prompt.info()}


def prompt_layout(engine: BlendEngine, prompt: str, index: ChunkTextIndex,
                  texts: Sequence[str] | None,
                  wrap: bool) -> FlatLayout:
    """Layout of ``prompt`` cut at the retrieved chunks' ``texts`` when given and found, else at
    the ingested texts of ``index``; none found: a plain full prefill. ``wrap=False``: the prompt
    is an already rendered chat."""
    flat = flat_layout(engine.prompts, prompt, index, texts=texts, wrap=wrap)
    if texts and flat.matched < len(texts):
        log.debug("%d of %d retrieved chunks not found verbatim in the prompt",
                  len(texts) - flat.matched, len(texts))
    if texts and flat.full_only:  # none found verbatim: the ingested texts may still be there
        flat = flat_layout(engine.prompts, prompt, index, wrap=wrap)
    return flat


def start(engine: BlendEngine, prompt: FlatLayout, blend: BlendConfig,
          generation: GenerationConfig) -> BlendRequest:
    """Prefill ``prompt`` (blending unless no chunk was found: then a full prefill) and open its
    token stream."""
    if prompt.full_only:
        blend = dataclasses.replace(blend, mode="full")  # nothing cached to blend
    return BlendRequest(prompt, engine.stream(prompt.layout, blend, generation))


def render_chat(engine: BlendEngine, turns: list[dict[str, str]]) -> str:
    """A conversation (``{"role", "content"}`` turns) as the model reads it: the tokenizer's chat
    template with the assistant header last, the engine's ``system`` message first when the
    turns have none."""
    system = engine.prompts.system
    if system is not None and not any(t["role"] == "system" for t in turns):
        turns = [{"role": "system", "content": system}, *turns]
    return engine.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
