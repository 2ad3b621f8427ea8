"""One request of a framework LLM, framework-neutral: find the chunks in the prompt the chain
built, start the engine's token stream (a plain full prefill when no chunk is known: said once
per LLM in a warning, counted, or refused with ``strict``), render a chat with the engine's
system message, and report what the request did.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationResult, GenerationStream
from blendrag.integration.flat_prompt import FlatLayout, flat_layout
from blendrag.integration.text_index import ChunkTextIndex

log = logging.getLogger(__name__)

FALLBACK_CAUSES = ("empty_index", "not_in_prompt", "documents_not_in_prompt")
"""Why a request found no known chunk: nothing was ingested into the LLM's text index; texts
were ingested but none is in this prompt; the request's own documents are not in it verbatim."""


class NoChunkFoundError(RuntimeError):
    """A ``strict`` framework LLM got a prompt with no known chunk (it would have run as a
    plain full prefill). Not a ValueError: LlamaIndex's refine synthesizer catches those and
    goes on with a logged warning, which would make ``strict`` silent again."""


@dataclass(frozen=True)
class FallbackFixes:
    """A framework's one-line fix for each cause of ``FALLBACK_CAUSES``."""

    empty_index: str
    not_in_prompt: str
    documents_not_in_prompt: str


_CAUSES = {
    "empty_index": "its text index is empty: no chunk was ingested through it in this process",
    "not_in_prompt": "none of the {n} ingested chunk texts is in the prompt",
    "documents_not_in_prompt": "none of the request's {docs} retrieved texts is in the prompt "
                               "verbatim, nor any ingested chunk text",
}


class FallbackMonitor:
    """What one LLM does when a request finds no known chunk: a warning the first time (cause
    and fix), a count every time, or ``NoChunkFoundError`` when ``strict``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self._warned = False

    def check(self, flat: FlatLayout, llm: str, index_size: int, fixes: FallbackFixes,
              strict: bool, documents: int = 0) -> None:
        """Act on ``flat`` if it falls back (``flat.fallback`` set)."""
        if flat.fallback is None:
            return
        why = _CAUSES[flat.fallback].format(n=index_size, docs=documents)
        message = (f"{llm} found no known chunk in the prompt and runs a plain full prefill: "
                   f"{why}. Fix: {getattr(fixes, flat.fallback)}")
        if strict:
            raise NoChunkFoundError(message)
        with self._lock:
            self.count += 1
            first, self._warned = not self._warned, True
        if first:
            log.warning("%s (said once per LLM; its `fallbacks` counts them, each response's "
                        "metadata says blended=False)", message)


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

    @property
    def blended(self) -> bool:
        """Whether cached chunk KVs were used (False: a plain full prefill)."""
        return self.result.stats.mode != "full" and self.prompt.matched > 0

    def info(self) -> dict[str, Any]:
        """What the request did: finish reason, whether it blended, ``RequestStats`` (mode,
        chunk hits/misses, recompute fraction, TTFT, ...) and how the prompt was laid out (chunks
        matched, fallback cause)."""
        result = self.result
        return {"finish_reason": result.finish_reason, "blended": self.blended,
                "blendrag": result.stats.to_dict(), "blendrag_prompt": self.prompt.info()}


def prompt_layout(engine: BlendEngine, prompt: str, index: ChunkTextIndex,
                  texts: Sequence[str] | None,
                  wrap: bool) -> FlatLayout:
    """Layout of ``prompt`` cut at the retrieved chunks' ``texts`` when given and found, else at
    the ingested texts of ``index``; none found: a plain full prefill. ``wrap=False``: the prompt
    is an already rendered chat. Its ``match_s`` is the time this took."""
    t0 = time.perf_counter()
    flat = flat_layout(engine.prompts, prompt, index, texts=texts, wrap=wrap)
    if texts and flat.matched < len(texts):
        log.debug("%d of %d retrieved chunks not found verbatim in the prompt",
                  len(texts) - flat.matched, len(texts))
    if texts and flat.full_only:  # none found verbatim: the ingested texts may still be there
        flat = flat_layout(engine.prompts, prompt, index, wrap=wrap)
    if flat.full_only and index.path is not None and not texts:
        before = len(index)
        index.refresh()  # another process (an ingestion job) may have added texts since
        if len(index) > before:
            flat = flat_layout(engine.prompts, prompt, index, wrap=wrap)
    cause = None
    if flat.full_only:
        cause = ("documents_not_in_prompt" if texts else
                 "empty_index" if not len(index) else "not_in_prompt")
    return dataclasses.replace(flat, fallback=cause, match_s=time.perf_counter() - t0)


def start(engine: BlendEngine, prompt: FlatLayout, blend: BlendConfig,
          generation: GenerationConfig,
          on_fallback: Callable[[FlatLayout], None] | None = None) -> BlendRequest:
    """Prefill ``prompt`` (blending unless no chunk was found: then a full prefill) and open its
    token stream. ``on_fallback(prompt)`` is called (it may raise) before a prefill that falls
    back to ``full`` although another mode was asked for. The request's stats count the
    prompt's layout time (``match_s``) in its TTFT."""
    if prompt.full_only:
        if blend.mode == "full":  # asked for: not a fallback
            prompt = dataclasses.replace(prompt, fallback=None)
        elif on_fallback is not None:
            on_fallback(prompt)
        blend = dataclasses.replace(blend, mode="full")  # nothing cached to blend
    # the request started when its chunks were looked for: TTFT counts from there
    started = time.perf_counter() - prompt.match_s
    stream = engine.stream(prompt.layout, blend, generation, started=started)
    stream.prefill.stats.timing.match_s = prompt.match_s
    return BlendRequest(prompt, stream)


def render_chat(engine: BlendEngine, turns: list[dict[str, str]]) -> str:
    """A conversation (``{"role", "content"}`` turns) as the model reads it: the tokenizer's chat
    template with the assistant header last, the engine's ``system`` message first when the
    turns have none."""
    system = engine.prompts.system
    if system is not None and not any(t["role"] == "system" for t in turns):
        turns = [{"role": "system", "content": system}, *turns]
    return engine.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
