"""How retrieved chunks are written into a prompt: each with the chunk template, joined with a
separator. One default for both frameworks.

``DEFAULT_CHUNK_TEMPLATE = "{text}"`` and ``DEFAULT_SEPARATOR = "\\n\\n"`` are what both
frameworks' stock chains render: LangChain's stuff-documents chain writes each Document as
``"{page_content}"`` and joins them with ``"\\n\\n"``; LlamaIndex's synthesizers join the nodes'
contents with ``"\\n\\n"``. With this default every retrieved chunk of a stock chain's prompt is
its ingested text verbatim, and the separators between chunks are small chunks of their own
(ingestion stores their KVs too). LangChain spells the template with its own variable name,
``"{page_content}"`` (``document_prompt``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_CHUNK_TEMPLATE = "{text}"
DEFAULT_SEPARATOR = "\n\n"
PLACEHOLDER = "{text}"


@dataclass(frozen=True)
class ChunkFormat:
    """``template`` (with one ``{text}``) writes one chunk; ``separator`` goes between chunks."""

    template: str = DEFAULT_CHUNK_TEMPLATE
    separator: str = DEFAULT_SEPARATOR

    def __post_init__(self) -> None:
        if PLACEHOLDER not in self.template:
            raise ValueError(f"chunk_template must contain '{PLACEHOLDER}', got {self.template!r}")

    def format(self, text: str) -> str:
        """``text`` as the prompt spells it (str.replace: texts and templates may hold braces)."""
        return self.template.replace(PLACEHOLDER, text)

    def join(self, chunks: Sequence[str]) -> str:
        """Formatted chunks as the context of a prompt."""
        return self.separator.join(chunks)

    def bare(self, text: str) -> str:
        """A formatted chunk without the template's head and tail (``text`` when it has neither)."""
        head, _, tail = self.template.partition(PLACEHOLDER)
        if text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail):
            return text[len(head):len(text) - len(tail)]
        return text

    def variants(self, texts: Iterable[str]) -> list[str]:
        """Each formatted chunk and its bare text: the last chunk of a stock chain's prompt may
        lack the template's tail, and a chat template may trim message content."""
        return [v for t in texts for v in dict.fromkeys((t, self.bare(t))) if v]
