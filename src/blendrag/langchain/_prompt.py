"""From what a LangChain chain hands the model (a flat prompt, maybe the Documents) to a layout.

The splitting itself is framework-free (:mod:`blendrag.flat_prompt`); what LangChain adds is
how a Document is spelled in the prompt (``format_document`` with the chain's document prompt).
"""

from __future__ import annotations

import logging
from typing import Sequence

from langchain_core.documents import Document
from langchain_core.prompts import PromptTemplate, format_document

from blendrag.engine import BlendEngine
from blendrag.flat_prompt import FlatLayout, flat_layout
from blendrag.text_index import ChunkTextIndex

log = logging.getLogger(__name__)

BlendPrompt = FlatLayout  # a request's layout and how its chunks were found


def format_documents(documents: Sequence[Document], document_prompt: str) -> list[str]:
    """Each Document as the prompt spells it (LangChain's ``format_document``)."""
    template = PromptTemplate.from_template(document_prompt)
    return [format_document(doc, template) for doc in documents]


def blend_prompt(engine: BlendEngine, prompt: str, index: ChunkTextIndex, documents: Sequence[Document] | None,
                 document_prompt: str, wrap: bool) -> FlatLayout:
    """Layout of ``prompt`` cut at the Documents' texts when given (and found), else at the
    ingested texts of ``index``. ``wrap=False``: the prompt is an already rendered chat."""
    texts = format_documents(documents, document_prompt) if documents else None
    flat = flat_layout(engine.prompts, prompt, index, texts=texts, wrap=wrap)
    if texts and flat.matched < len(texts):
        log.debug("%d of %d documents not found verbatim in the prompt (formatted with %r)",
                  len(texts) - flat.matched, len(texts), document_prompt)
    if texts and flat.full_only:  # none found verbatim: the ingested texts may still be there
        flat = flat_layout(engine.prompts, prompt, index, wrap=wrap)
    return flat
