"""BlendChroma: a Chroma vector store that precomputes the KV of every text added to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

try:
    from langchain_chroma import Chroma
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("BlendChroma needs langchain-chroma: pip install blendrag[chroma]") from exc
from langchain_core.documents import Document
from tqdm.auto import tqdm

from blendrag.engine.profile import profile_depth
from blendrag.langchain._base import BlendParams
from blendrag.langchain._prompt import format_documents


@dataclass
class IngestCounts:
    """KVs computed by this store's ingestion so far, and texts whose KV was already stored
    (texts without any token have no KV and count as neither)."""

    computed: int = 0
    skipped: int = 0


class BlendChroma(Chroma):
    """``langchain_chroma.Chroma`` whose ingestion also precomputes chunk KVs.

    ``add_texts`` is the one method every Chroma ingestion path goes through
    (``add_documents``, ``from_documents``, ``from_texts``, their async forms); after storing
    the vectors it formats each text as the chain will (``llm.document_prompt``), records it in
    ``llm.text_index`` (so flat prompts can be split at it) and stores its KV with
    ``llm.engine.ingest`` (already stored KVs are not recomputed). ``separators`` (the stuff
    chain's ``document_separator``) get their KV stored too, as they sit between chunks.

    >>> store = BlendChroma.from_documents(docs, embedding=embedder, llm=llm)
    >>> retriever = store.as_retriever(search_kwargs={"k": 3})

    ``llm``: the :class:`BlendLLM` / :class:`ChatBlend` that will answer; its engine needs a
    ``chunk_prefix`` (the chains' prompt prefixes are not known at ingestion).
    ``show_progress``: tqdm bar for the KV precompute; None = for batches of at least
    ``PROGRESS_MIN`` texts.
    ``profile``: also measure each new chunk's context-sensitivity profile, for an ``llm``
    blending with ``selector="profile"`` (otherwise measured at its first query): one more
    forward per chunk (``profile=k``: after each of the k texts before it, k forwards). Each
    text of an ``add_texts`` call is measured after the text before it in that call (the first
    after the last), so add a document's chunks in order, in one call;
    the separators after the last text. Other arguments are Chroma's.
    """

    PROGRESS_MIN = 32

    def __init__(self, *args: Any, llm: BlendParams, separators: Sequence[str] = ("\n\n",),
                 show_progress: bool | None = None, profile: bool | int = False, **kwargs: Any) -> None:
        if llm.engine.prompts.chunk_prefix is None:
            raise ValueError("the engine has no chunk_prefix, so KVs cannot be precomputed before the prompt is "
                             "known: create it with chunk_prefix=... (e.g. \"\")")
        super().__init__(*args, **kwargs)
        self.llm = llm
        self.separators = tuple(s for s in separators if s)
        self.show_progress = show_progress
        profile_depth(profile)  # refuse a bad value now, not at the first add_texts
        self.profile = profile
        self.ingest_counts = IngestCounts()

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Add texts (Chroma) and precompute their KVs; returns the ids."""
        texts = list(texts)
        added = super().add_texts(texts, metadatas=metadatas, ids=ids, **kwargs)
        self._ingest(texts, metadatas)
        return added

    def update_documents(self, ids: list[str], documents: list[Document]) -> None:
        """Update documents (Chroma) and precompute the KVs of their new texts."""
        super().update_documents(ids, documents)
        self._ingest([d.page_content for d in documents], [d.metadata for d in documents])

    def ingest_existing(self) -> IngestCounts:
        """Precompute KVs and record texts of everything already in the collection (a store
        opened over a collection filled elsewhere); returns the counts of this call."""
        got = self.get(include=["documents", "metadatas"])
        return self._ingest(got["documents"], got["metadatas"])

    def _ingest(self, texts: list[str], metadatas: list[dict] | None) -> IngestCounts:
        metas = list(metadatas or []) + [{}] * (len(texts) - len(metadatas or []))
        docs = [Document(page_content=t, metadata=m or {}) for t, m in zip(texts, metas)]
        chunks = format_documents(docs, self.llm.document_prompt)
        self.llm.text_index.add_many(chunks)
        engine = self.llm.engine
        ids = [i for i in map(engine.prompts.encode, chunks) if i]  # a text without tokens has no KV
        if not ids:
            return IngestCounts()
        show = len(ids) >= self.PROGRESS_MIN if self.show_progress is None else self.show_progress
        prefix_ids = engine.prompts.chunk_prefix_ids()
        with tqdm(total=len(ids), desc="precomputing chunk KVs", unit="chunk", disable=not show) as bar:
            computed = engine.precompute(prefix_ids, ids, profile=self.profile, on_chunk=lambda i, now: bar.update(1))
        counts = IngestCounts(computed=sum(computed), skipped=len(computed) - sum(computed))
        if self.separators:
            # With profile, behind the last text (stored now, so skipped): the separators sit
            # between texts in the prompt and are measured after one.
            seps = [engine.prompts.encode(s) for s in self.separators]
            depth = profile_depth(self.profile)
            engine.precompute(prefix_ids, [*ids[-depth:], *seps] if depth else seps, profile=self.profile)
        self.ingest_counts.computed += counts.computed
        self.ingest_counts.skipped += counts.skipped
        return counts
