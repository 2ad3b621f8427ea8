"""How an application lays out its prompts and stores its chunk KVs: a *flow*.

Fidelity depends on what the chunk KVs were computed after and on how the prompt is cut into
pieces, so a fidelity check (a calibration, ``blendrag bench fidelity``) must run the very code
the user's application runs, not a copy of it:

- ``IntegrationFlow``: what LangChain's and LlamaIndex's ``BlendLLM`` run. The chunks are
  ingested through the integration client (``BlendClient.ingest``: texts recorded, KVs
  computed after the engine's ``chunk_prefix``, the separator stored as a chunk of its own),
  and the prompt is the flat string a stock chain renders, ``prefix + "\\n\\n".join(chunks) +
  suffix``, laid out by the client exactly as a request is (``BlendClient.layout``, with the
  chunks as the retrieved documents).
- ``EngineFlow``: what a ``BlendEngine`` user runs: ``engine.ingest(chunks, prefix=prefix)``
  and ``engine.build_prompt(prefix, chunks, suffix)`` (chunk KVs after the engine's
  ``chunk_prefix``, else after each prompt's own prefix).

Both compute chunks in the engine's ingestion context, with its chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from blendrag.calibration import FLOWS
from blendrag.engine.caches.context import DEFAULT_FILLERS
from blendrag.engine.engine import BlendEngine
from blendrag.prompt import PromptLayout

if TYPE_CHECKING:
    from blendrag.integration.client import BlendClient

__all__ = ["FLOWS", "EngineFlow", "Flow", "IntegrationFlow", "PromptParts", "make_flow"]


class PromptParts(Protocol):
    """A prompt as an application builds it: ``prefix`` (instruction), the retrieved ``chunks``
    in order, ``suffix`` (the question and the answer cue)."""

    @property
    def prefix(self) -> str: ...

    @property
    def chunks(self) -> Sequence[str]: ...

    @property
    def suffix(self) -> str: ...


class Flow(Protocol):
    """Lays out a prompt and stores its chunk KVs, as some application does."""

    def layout(self, item: PromptParts) -> PromptLayout:
        """The ids every mode runs on (no side effect: also used to check the length)."""
        ...

    def ingest(self, index: int, item: PromptParts, layout: PromptLayout) -> None:
        """Store the prompt's chunk KVs (ingestion, untimed)."""
        ...

    def describe(self) -> str:
        """What it runs, in words, for a report's header."""
        ...


def context_words(engine: BlendEngine) -> str:
    """The engine's ingestion context in words."""
    context = engine.context
    if not context.fillers:
        return "no ingestion context (each chunk computed right after the chunk prefix)"
    which = "the default" if context.fillers == DEFAULT_FILLERS else "your"
    first = ("; a prompt's first passage exact when its prefix is the chunk prefix"
             if context.exact_first else "")
    return f"ingestion context: {which} {len(context.fillers)} filler contexts{first}"


def prefix_words(engine: BlendEngine) -> str:
    """What the engine computes chunk KVs after, in words."""
    prefix = engine.prompts.chunk_prefix if engine.prompts is not None else None
    return ("after each prompt's own prefix" if prefix is None
            else f"after the chunk prefix {prefix!r}")


class EngineFlow:
    """A ``BlendEngine`` user's flow: ``engine.ingest(chunks, prefix=prefix)``, then
    ``engine.build_prompt(prefix, chunks, suffix)``. ``profile``: measure context profiles
    at ingestion (for the profile selector)."""

    def __init__(self, engine: BlendEngine, profile: bool = False) -> None:
        self.engine, self.profile = engine, profile

    def layout(self, item: PromptParts) -> PromptLayout:
        return self.engine.build_prompt(item.prefix, list(item.chunks), item.suffix)

    def ingest(self, index: int, item: PromptParts, layout: PromptLayout) -> None:
        self.engine.ingest(list(item.chunks), prefix=item.prefix, profile=self.profile)

    def describe(self) -> str:
        return (f"flow `engine` (BlendEngine.ingest + build_prompt): prefix + chunks + suffix "
                f"as given, chunk KVs computed {prefix_words(self.engine)}; "
                f"{context_words(self.engine)}")


class IntegrationFlow:
    """The framework LLMs' flow (LangChain's ``BlendLLM`` / ``ChatBlend``, LlamaIndex's
    ``BlendLLM``), through their client: chunks ingested with ``BlendClient.ingest``, the flat
    prompt ``prefix + separator.join(chunks) + suffix`` laid out by ``BlendClient.layout`` with
    the chunks as the request's documents. The engine needs a ``chunk_prefix``, as the
    frameworks' do (ValueError naming the fix otherwise)."""

    def __init__(self, engine: BlendEngine, profile: bool = False, name: str = "fidelity") -> None:
        from blendrag.integration.client import BlendClient
        from blendrag.integration.fallback import FallbackFixes
        from blendrag.integration.text_index import ChunkTextIndex

        fix = "a chunk is not in its prompt verbatim"
        self.client: BlendClient = BlendClient(
            engine, ChunkTextIndex(), fixes=FallbackFixes(fix, fix, fix, fix), name=name)
        self.client.require_chunk_prefix()
        self.engine, self.profile = engine, profile

    def prompt(self, item: PromptParts) -> str:
        """The flat prompt a stock chain renders: the chunks joined with the separator."""
        fmt = self.client.chunk_format
        return item.prefix + fmt.join([fmt.format(c) for c in item.chunks]) + item.suffix

    def layout(self, item: PromptParts) -> PromptLayout:
        fmt = self.client.chunk_format
        flat = self.client.layout(self.prompt(item), texts=[fmt.format(c) for c in item.chunks])
        if flat.full_only:
            raise ValueError(f"no chunk found in the prompt {self.prompt(item)[:60]!r}...: the "
                             "integration would run it as a plain full prefill")
        return flat.layout

    def ingest(self, index: int, item: PromptParts, layout: PromptLayout) -> None:
        fmt = self.client.chunk_format
        self.client.ingest([fmt.format(c) for c in item.chunks], profile=self.profile,
                           progress=False)

    def describe(self) -> str:
        sep = self.client.chunk_format.separator
        return (f"flow `integration` (LangChain's and LlamaIndex's BlendLLM): prefix + the "
                f"chunks joined with {sep!r} + suffix, laid out by the integration client "
                f"(separators are chunks of their own), chunk KVs computed "
                f"{prefix_words(self.engine)}; {context_words(self.engine)}")


def flow_settings(runs: Flow, engine: BlendEngine) -> dict:
    """What a calibration's saved progress must share with the run that takes it up, of how
    its prompts are made: the flow in words (its chunk prefix, ingestion context and
    separators), the chat template's use and the engine's system message."""
    prompts = engine.prompts
    return {"flow": runs.describe(), "chat": prompts.chat if prompts is not None else None,
            "system": prompts.system if prompts is not None else None}


def make_flow(name: str, engine: BlendEngine, profile: bool = False) -> Flow:
    """The flow called ``name`` (one of ``FLOWS``) on ``engine``."""
    if name == "integration":
        return IntegrationFlow(engine, profile)
    if name == "engine":
        return EngineFlow(engine, profile)
    raise ValueError(f"flow must be one of {', '.join(FLOWS)}, got {name!r}")
