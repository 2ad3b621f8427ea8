"""From a flat prompt string (what framework chains hand an LLM) to a layout.

One path for every framework entry point: find the chunk texts in the prompt (the retrieved
documents' texts when the caller passes them, else the ingested texts of a
:class:`ChunkTextIndex`), cut the prompt there into prefix / chunks / suffix, and tokenize
each piece on its own (docs/architecture.md, "Exactness rules"). Both sources use the same
splitter, so the same chunks give the same layout, hence the same answer. A prompt with no
known chunk is run as a plain full prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from blendrag.integration.text_index import ChunkTextIndex, PromptSplit, find_texts, split_spans
from blendrag.prompt import PromptBuilder, PromptLayout


@dataclass(frozen=True)
class FlatLayout:
    """A flat prompt's layout and how its chunks were found.

    ``source``: "documents" (texts given with the request), "index" (ingested texts) or "none"
    (no known chunk: run it with mode="full"). ``matched``: chunks that are known texts;
    ``chunks``: all chunks, gaps between known texts included. ``fallback``: with source
    "none", why no chunk was found (``requests.FALLBACK_CAUSES``). ``match_s``: seconds spent
    finding the chunks and tokenizing the pieces.
    """

    layout: PromptLayout
    source: str
    matched: int
    chunks: int
    fallback: str | None = None
    match_s: float = 0.0

    @property
    def full_only(self) -> bool:
        return self.source == "none"

    def info(self) -> dict:
        return {"source": self.source, "matched_chunks": self.matched, "chunks": self.chunks,
                "fallback": self.fallback, "match_s": self.match_s}


def split_at(prompt: str, texts: Sequence[str]) -> PromptSplit:
    """Split ``prompt`` at the given chunk texts (known boundaries, however short)."""
    return split_spans(prompt, find_texts(prompt, texts))


def flat_layout(builder: PromptBuilder, prompt: str, index: ChunkTextIndex,
                texts: Sequence[str] | None = None, wrap: bool = True) -> FlatLayout:
    """Layout of ``prompt`` cut at ``texts`` (recorded in ``index`` for later flat prompts)
    or, without texts, at the texts ``index`` holds. ``wrap``: add the builder's chat template
    (False when the prompt is already rendered with it)."""
    if texts:
        index.add_many(texts)
        split, source = split_at(prompt, texts), "documents"
    else:
        split, source = index.split(prompt), "index"
    found = _layout(builder, split, wrap, source)
    return found or FlatLayout(builder.whole(prompt, wrap), "none", 0, 0)


def _layout(builder: PromptBuilder, split: PromptSplit, wrap: bool,
            source: str) -> FlatLayout | None:
    """Pieces tokenized one by one; None when no known chunk is left to reuse."""
    if not split.found:
        return None
    head, tail = builder.template_parts if wrap else ("", "")
    pieces = [(builder.encode(c), known) for c, known in zip(split.chunks, split.cached)]
    pieces = [(ids, known) for ids, known in pieces if ids]  # e.g. whitespace a tokenizer drops
    suffix = builder.encode(split.suffix + tail)
    if not suffix and pieces:  # the prompt ends with a chunk: it is computed, as the suffix
        suffix = pieces.pop()[0]
    matched = sum(known for _, known in pieces)
    if not matched:
        return None
    chunk_prefix_ids = builder.chunk_prefix_ids() if builder.chunk_prefix is not None else None
    layout = PromptLayout(builder.encode(head + split.prefix, first=True),
                          [ids for ids, _ in pieces], suffix,
                          chunk_prefix_ids=chunk_prefix_ids)
    return FlatLayout(layout, source, matched, len(pieces))
