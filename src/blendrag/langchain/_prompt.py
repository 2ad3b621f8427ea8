"""From what a LangChain chain hands the model (a flat prompt, maybe the Documents) to a layout.

One path for every entry point (text or chat, streaming or not, Documents or flat prompt):
find the chunk texts in the prompt string, split it there into prefix / chunks / suffix and
tokenize the pieces separately (DESIGN.md §2). The chunk texts come from the Documents when
the chain passes them (``documents=``), else from the shared :class:`ChunkTextIndex` that the
ingestion hook filled. Both use the same splitter, so for the same chunks they give the same
layout, hence the same answer.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Sequence

from langchain_core.documents import Document
from langchain_core.prompts import PromptTemplate, format_document

from blendrag.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag.text_index import ChunkTextIndex, PromptSplit

log = logging.getLogger(__name__)

# ChunkTextIndex is a plain dict-of-sets: requests may look up while ingestion adds texts.
INDEX_LOCK = threading.RLock()


@dataclass(frozen=True)
class BlendPrompt:
    """A request's layout and how its chunks were found.

    ``source``: ``documents`` (the Documents passed), ``index`` (the shared text index) or
    ``none`` (no known chunk in the prompt: a plain full prefill of the whole prompt).
    ``matched``: chunks that are known texts; ``chunks``: all chunks incl. gaps between them.
    """

    layout: PromptLayout
    source: str
    matched: int
    chunks: int

    @property
    def full_only(self) -> bool:
        return self.source == "none"

    def info(self) -> dict:
        return {"source": self.source, "matched_chunks": self.matched, "chunks": self.chunks}


def format_documents(documents: Sequence[Document], document_prompt: str) -> list[str]:
    """Each Document as the prompt spells it (LangChain's ``format_document``)."""
    template = PromptTemplate.from_template(document_prompt)
    return [format_document(doc, template) for doc in documents]


def split_prompt(prompt: str, index: ChunkTextIndex, documents: Sequence[Document] | None,
                 document_prompt: str) -> tuple[PromptSplit, str]:
    """Split ``prompt`` at the Documents' texts when given (and found), else at the indexed texts.

    Texts of the given Documents are also recorded in ``index`` (their KVs get cached by the
    request), so a later flat prompt with the same chunks splits the same way.
    """
    if documents:
        texts = format_documents(documents, document_prompt)
        # Same splitter as the shared index (same spans, gaps and tie-breaking); min_chars=1
        # because these are known chunk boundaries, however short.
        local = ChunkTextIndex(min_chars=1)
        local.add_many(texts)
        split = local.split(prompt)
        if split.found < len(texts):
            log.debug("%d of %d documents not found verbatim in the prompt (formatted with %r)",
                      len(texts) - split.found, len(texts), document_prompt)
        if split.found:
            with INDEX_LOCK:
                index.add_many(texts)
            return split, "documents"
    with INDEX_LOCK:
        return index.split(prompt), "index"


def _pieces(split: PromptSplit, needs_suffix: bool) -> tuple[str, list[str], list[bool], str]:
    chunks, cached, suffix = list(split.chunks), list(split.cached), split.suffix
    if needs_suffix and not suffix and chunks:
        # The prompt ends with a chunk but a layout must end with computed tokens: that chunk
        # is computed as the suffix instead of reused.
        suffix = chunks.pop()
        cached.pop()
    return split.prefix, chunks, cached, suffix


def text_prompt(engine: BlendEngine, prompt: str, split: PromptSplit, source: str) -> BlendPrompt:
    """Layout of a completion prompt: ``engine.build_prompt`` (chat template around it if on)."""
    prefix, chunks, cached, suffix = _pieces(split, needs_suffix=not engine.prompts.chat)
    if not any(cached):
        flat = engine.prompts.encode(engine.prompts.render("", [prompt], ""), first=True)
        return BlendPrompt(_flat_layout(flat), "none", 0, 0)
    return BlendPrompt(engine.build_prompt(prefix, chunks, suffix), source, sum(cached), len(chunks))


def chat_prompt(engine: BlendEngine, rendered: str, split: PromptSplit, source: str) -> BlendPrompt:
    """Layout of a prompt already rendered with the chat template (it spells its own specials,
    so no piece gets extra special tokens)."""
    prefix, chunks, cached, suffix = _pieces(split, needs_suffix=True)
    encode = engine.prompts.encode
    if not any(cached):
        return BlendPrompt(_flat_layout(encode(rendered)), "none", 0, 0)
    builder = engine.prompts
    layout = PromptLayout(
        prefix_ids=encode(prefix), chunk_ids=[encode(c) for c in chunks], suffix_ids=encode(suffix),
        kv_prefix_ids=None if builder.chunk_prefix is None else builder.kv_prefix_ids(),
    )
    return BlendPrompt(layout, source, sum(cached), len(chunks))


def _flat_layout(ids: Sequence[int]) -> PromptLayout:
    """The whole prompt tokenized as one string, for a plain full prefill. PromptLayout wants a
    chunk and a suffix, so the last token is the suffix and the rest one (computed) chunk."""
    if len(ids) < 2:
        raise ValueError(f"the prompt is too short to run ({len(ids)} token(s)); give it some text")
    return PromptLayout(prefix_ids=(), chunk_ids=(tuple(ids[:-1]),), suffix_ids=tuple(ids[-1:]))
