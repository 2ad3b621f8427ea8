"""From what a LangChain chain hands the model (a flat prompt, maybe the Documents) to a layout.

The splitting itself is framework-neutral (:mod:`blendrag.integration.requests`); what LangChain
adds is how a Document is spelled in the prompt (``format_document`` with the chain's document
prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.documents import Document
from langchain_core.prompts import PromptTemplate, format_document

from blendrag.engine import BlendEngine
from blendrag.integration.flat_prompt import FlatLayout
from blendrag.integration.requests import prompt_layout
from blendrag.integration.text_index import ChunkTextIndex

BlendPrompt = FlatLayout  # a request's layout and how its chunks were found


def format_documents(documents: Sequence[Document], document_prompt: str) -> list[str]:
    """Each Document as the prompt spells it (LangChain's ``format_document``)."""
    template = PromptTemplate.from_template(document_prompt)
    return [format_document(doc, template) for doc in documents]


def blend_prompt(engine: BlendEngine, prompt: str, index: ChunkTextIndex,
                 documents: Sequence[Document] | None,
                 document_prompt: str, wrap: bool) -> FlatLayout:
    """Layout of ``prompt`` cut at the Documents' texts when given (and found), else at the
    ingested texts of ``index``. ``wrap=False``: the prompt is an already rendered chat."""
    texts = format_documents(documents, document_prompt) if documents else None
    return prompt_layout(engine, prompt, index, texts, wrap)
