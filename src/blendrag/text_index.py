"""Former home of ``ChunkTextIndex`` (now ``blendrag.integration.text_index``); kept importable."""

from blendrag.integration.text_index import ANCHOR, ChunkTextIndex, PromptSplit

__all__ = ["ANCHOR", "ChunkTextIndex", "PromptSplit"]
