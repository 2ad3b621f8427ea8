"""BlendChroma: a Chroma vector store that precomputes the KV of every text added to it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

try:
    from langchain_chroma import Chroma
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("BlendChroma needs langchain-chroma: pip install blendrag[chroma]") from exc
from langchain_core.documents import Document
from tqdm.auto import tqdm

from blendrag.config import profile_depth
from blendrag.ingest import IngestCounts
from blendrag.integration.chunks import DEFAULT_SEPARATOR
from blendrag.integration.client import PROGRESS_MIN
from blendrag.langchain.llm import BlendParams, format_documents, unbound


class BlendChroma(Chroma):
    """``langchain_chroma.Chroma`` whose ingestion also precomputes chunk KVs.

    ``add_texts`` is the one method every Chroma ingestion path goes through
    (``add_documents``, ``from_documents``, ``from_texts``, their async forms); after storing
    the vectors it formats each text as the chain will (``llm.document_prompt``), records it in
    ``llm.text_index`` (so flat prompts can be split at it) and stores its KV with
    the one ingestion path (already stored KVs are not recomputed). ``separators`` (the stuff
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
    the separators after the last text.
    ``record_existing``: when the collection already holds documents (a persisted store
    reopened in a new process), record their texts in ``llm.text_index`` now (no KV computed;
    progress bar from ``PROGRESS_MIN`` texts), so the first query finds its chunks; their KVs
    come from the engine's store, or are computed once at the first query that needs them
    (``ingest_existing()`` precomputes them all). Other arguments are Chroma's.
    """

    PROGRESS_MIN = PROGRESS_MIN

    def __init__(self, *args: Any, llm: BlendParams,
                 separators: Sequence[str] = (DEFAULT_SEPARATOR,),
                 show_progress: bool | None = None, profile: bool | int = False,
                 record_existing: bool = True, **kwargs: Any) -> None:
        llm = unbound(llm)  # llm.bind(...), with_config(...): the LLM they wrap
        if not isinstance(llm, BlendParams):
            raise TypeError(f"BlendChroma(llm=...) takes blendrag's LangChain BlendLLM or "
                            f"ChatBlend (blendrag.langchain), got {type(llm).__module__}."
                            f"{type(llm).__name__}")
        llm.client.require_chunk_prefix()
        super().__init__(*args, **kwargs)
        self.llm = llm
        self.separators = tuple(s for s in separators if s)
        self.show_progress = show_progress
        profile_depth(profile)  # refuse a bad value now, not at the first add_texts
        self.profile = profile
        self.ingest_counts = IngestCounts()
        if record_existing:
            self.record_existing()

    @classmethod
    def from_texts(cls, texts: list[str], *args: Any, **kwargs: Any) -> BlendChroma:
        """Chroma's ``from_texts`` (and so ``from_documents``), refusing an empty list with
        the fix (Chroma's own error does not say what to do)."""
        texts = list(texts)
        if not texts:
            raise ValueError("BlendChroma.from_documents / from_texts got no documents: there is "
                             "nothing to store or to precompute. Check that your loader found "
                             "your files, or open an existing collection with "
                             "BlendChroma(collection_name=..., embedding_function=..., llm=llm)")
        return super().from_texts(texts, *args, **kwargs)  # type: ignore[return-value]

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Add texts (Chroma) and precompute their KVs; returns the ids. Every text is checked
        first: one the model cannot hold (ValueError naming it) adds no document, vector or
        recorded text, so the same call, fixed, adds each once."""
        texts = list(texts)
        chunks = self._chunks(texts, metadatas)
        self.llm.client.check(chunks)
        added = super().add_texts(texts, metadatas=metadatas, ids=ids, **kwargs)
        self._ingest_chunks(chunks)
        return added

    def update_documents(self, ids: list[str], documents: list[Document]) -> None:
        """Update documents (Chroma) and precompute the KVs of their new texts (checked first,
        as in :meth:`add_texts`)."""
        chunks = self._chunks([d.page_content for d in documents], [d.metadata for d in documents])
        self.llm.client.check(chunks)
        super().update_documents(ids, documents)
        self._ingest_chunks(chunks)

    def ingest_existing(self) -> IngestCounts:
        """Precompute KVs and record texts of everything already in the collection (a store
        opened over a collection filled elsewhere); returns the counts of this call."""
        got = self.get(include=["documents", "metadatas"])
        return self._ingest(got["documents"], got["metadatas"])

    def record_existing(self, page: int = 10_000) -> int:
        """Record the texts of the documents already in the collection in ``llm.text_index``
        (those it lacks; no KV is computed); returns how many were new."""
        index, total = self.llm.client.text_index, self._collection.count()
        show = total >= self.PROGRESS_MIN if self.show_progress is None else self.show_progress
        new = 0
        with tqdm(total=total, desc="recording chunk texts", unit="text",
                  disable=not show or not total) as bar:
            for offset in range(0, total, page):
                got = self.get(include=["documents", "metadatas"], limit=page, offset=offset)
                docs = [Document(page_content=t or "", metadata=m or {})
                        for t, m in zip(got["documents"], got["metadatas"])]
                chunks = [c for c in format_documents(docs, self.llm.document_prompt)
                          if c not in index]
                new += index.record(chunks)
                bar.update(len(docs))
        return new

    def _ingest(self, texts: list[str], metadatas: list[dict] | None) -> IngestCounts:
        return self._ingest_chunks(self._chunks(texts, metadatas))

    def _chunks(self, texts: list[str], metadatas: list[dict] | None) -> list[str]:
        """The texts as the LLM's document prompt writes them into prompts (LangChain's
        ValueError names a variable a document's metadata lacks)."""
        metas = list(metadatas or []) + [{}] * (len(texts) - len(metadatas or []))
        docs = [Document(page_content=t, metadata=m or {}) for t, m in zip(texts, metas)]
        return format_documents(docs, self.llm.document_prompt)

    def _ingest_chunks(self, chunks: list[str]) -> IngestCounts:
        counts = self.llm.client.ingest(chunks, profile=self.profile, separators=self.separators,
                                        progress=self.show_progress,
                                        progress_min=self.PROGRESS_MIN)
        self.ingest_counts += counts
        return counts
