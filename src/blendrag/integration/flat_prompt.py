"""From a flat prompt string (what framework chains hand an LLM) to a layout.

One path for every framework entry point: find the chunk texts in the prompt (the retrieved
documents' texts when the caller passes them, else the ingested texts of a
:class:`ChunkTextIndex`), cut the prompt there into prefix / chunks / suffix, and tokenize the
prompt as one string, cut at the pieces (docs/architecture.md, "Exactness rules"): the layout's
ids are the prompt's, as a plain LLM would run them. Both sources use the same
splitter, so the same chunks give the same layout, hence the same answer. A prompt with no
known chunk is run as a plain full prefill.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from blendrag.integration.text_index import ChunkTextIndex, PromptSplit, find_texts, split_spans
from blendrag.prompt import PromptBuilder, PromptLayout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlatLayout:
    """A flat prompt's layout and how its chunks were found.

    ``source``: "documents" (texts given with the request), "index" (ingested texts) or "none"
    (no known chunk: run it with mode="full"). ``matched``: chunks that are known texts (the
    passages); ``chunks``: all chunks, gaps between known texts (separators) included;
    ``known``: per chunk, whether it is a known text. ``fallback``: with source "none", why no
    chunk was found (``fallback.FALLBACK_CAUSES``). ``match_s``: seconds spent finding the
    chunks and tokenizing the pieces. ``passage_hits``: once the request ran, the passages
    whose KV was read from the store (separators not counted); ``passage_head``: those whose
    rows came whole from the prefix cache (an earlier turn's); None before.
    """

    layout: PromptLayout
    source: str
    matched: int
    chunks: int
    fallback: str | None = None
    match_s: float = 0.0
    known: tuple[bool, ...] = ()
    passage_hits: int | None = None
    passage_head: int | None = None

    @property
    def full_only(self) -> bool:
        return self.source == "none"

    def info(self) -> dict:
        return {"source": self.source, "matched_chunks": self.matched, "chunks": self.chunks,
                "passage_hits": self.passage_hits, "passage_head": self.passage_head,
                "fallback": self.fallback,
                "match_s": self.match_s}

    def after(self, hit_chunks: Sequence[int], head_tokens: int = 0) -> FlatLayout:
        """This layout once its request ran: ``passage_hits`` from the engine's ``hit_chunks``,
        ``passage_head`` the passages inside the first ``head_tokens`` rows (the prefix
        cache's)."""
        hits = sum(1 for i in hit_chunks if i < len(self.known) and self.known[i])
        head = sum(1 for i, (_, end) in enumerate(self.layout.chunk_spans)
                   if i < len(self.known) and self.known[i] and end <= head_tokens)
        return dataclasses.replace(self, passage_hits=hits, passage_head=head)


def split_at(prompt: str, texts: Sequence[str]) -> PromptSplit:
    """Split ``prompt`` at the given chunk texts (known boundaries, however short)."""
    return split_spans(prompt, find_texts(prompt, texts))


def find_layout(builder: PromptBuilder, prompt: str, index: ChunkTextIndex,
                texts: Sequence[str] | None, templated: bool) -> FlatLayout:
    """Layout of ``prompt`` cut at the retrieved chunks' ``texts`` when given and found, else at
    the ingested texts of ``index``; none found: a plain full prefill (``fallback`` says why).
    ``templated``: the prompt already spells the chat template. Its ``match_s`` is the time
    this took."""
    t0 = time.perf_counter()
    flat = flat_layout(builder, prompt, index, texts, templated)
    if texts and flat.matched < len(texts):
        log.debug("%d of %d retrieved chunks not found verbatim in the prompt",
                  len(texts) - flat.matched, len(texts))
    if texts and flat.full_only:  # none found verbatim: the ingested texts may still be there
        flat = flat_layout(builder, prompt, index, templated=templated)
    if flat.full_only and index.path is not None and not texts:
        before = len(index)
        index.refresh()  # another process (an ingestion job) may have added texts since
        if len(index) > before:
            flat = flat_layout(builder, prompt, index, templated=templated)
    cause = None
    if flat.full_only:
        cause = ("documents_not_in_prompt" if texts else
                 "empty_index" if not len(index) else "not_in_prompt")
    return dataclasses.replace(flat, fallback=cause, match_s=time.perf_counter() - t0)


def flat_layout(builder: PromptBuilder, prompt: str, index: ChunkTextIndex,
                texts: Sequence[str] | None = None, templated: bool = False) -> FlatLayout:
    """Layout of ``prompt`` cut at ``texts`` (recorded in ``index`` for later flat prompts)
    or, without texts, at the texts ``index`` holds. ``templated``: the prompt already spells
    the builder's chat template (else the builder adds it)."""
    if texts:
        index.record(texts)
        split, source = split_at(prompt, texts), "documents"
    else:
        split, source = index.split(prompt), "index"
    found = _layout(builder, split, templated, source)
    return found or FlatLayout(builder.whole(prompt, templated), "none", 0, 0)


def _layout(builder: PromptBuilder, split: PromptSplit, templated: bool,
            source: str) -> FlatLayout | None:
    """The prompt tokenized as one string and cut at its pieces (``PromptBuilder.encode_cut``:
    the ids a plain LLM runs, so a full prefill of the layout is one of the prompt as sent);
    None when no known chunk is left to reuse."""
    if not split.found:
        return None
    head, tail = ("", "") if templated else builder.template_parts
    texts = [head + split.prefix, *split.chunks, split.suffix + tail]
    cut = builder.encode_cut(texts, first=not templated)
    if cut is None:  # no offsets: each piece on its own, the ids of a chunk wherever it is
        cut = [builder.encode(texts[0], first=not templated),
               *(builder.encode(t) for t in texts[1:])]
    prefix, suffix = cut[0], cut[-1]
    pieces = [(ids, known) for ids, known in zip(cut[1:-1], split.cached)
              if ids]  # e.g. whitespace a tokenizer drops, or merged into the piece before
    if not suffix and pieces:  # the prompt ends with a chunk: it is computed, as the suffix
        suffix = pieces.pop()[0]
    matched = sum(known for _, known in pieces)
    if not matched:
        return None
    chunk_prefix_ids = builder.chunk_prefix_ids() if builder.chunk_prefix is not None else None
    layout = PromptLayout(prefix, [ids for ids, _ in pieces], suffix,
                          chunk_prefix_ids=chunk_prefix_ids)
    return FlatLayout(layout, source, matched, len(pieces),
                      known=tuple(known for _, known in pieces))
