"""Find ingested chunk texts inside a flat prompt string.

Stock chains (LangChain's stuff-documents chain, LlamaIndex synthesizers) hand the LLM one
string. To blend it anyway, the ingestion hooks record every chunk text here, and the LLM
splits the prompt at the chunk texts it contains: no separator string is asked of the user.

Lookup is by anchors: the first ``ANCHOR`` characters of each text (the whole text if shorter)
index the texts that start with them; scanning the prompt costs one dict lookup per
position and anchor length, and a candidate is accepted only if the whole text matches.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ANCHOR = 32


@dataclass(frozen=True)
class PromptSplit:
    """prefix + chunks + suffix == the prompt; ``cached[i]`` says chunk i is an indexed text
    (the others are the gaps between indexed texts, e.g. separators)."""

    prefix: str
    chunks: tuple[str, ...]
    suffix: str
    cached: tuple[bool, ...]

    @property
    def found(self) -> int:
        return sum(self.cached)


class ChunkTextIndex:
    """Chunk texts by anchor; optionally persisted (diskcache, process-safe) under ``path``."""

    def __init__(self, path: str | Path | None = None, min_chars: int = 16) -> None:
        if min_chars < 1:
            raise ValueError(f"min_chars must be >= 1, got {min_chars}")
        self.min_chars = min_chars
        # Requests look texts up while ingestion (another thread) adds them.
        self._lock = threading.RLock()
        self._by_anchor: dict[str, set[str]] = {}
        self._lengths: set[int] = set()
        self._disk = None
        if path is not None:
            import diskcache

            self._disk = diskcache.Cache(str(path))
            for key in self._disk.iterkeys():
                self._index(self._disk[key])

    def add(self, text: str) -> bool:
        """Record ``text``; False when it is too short to be matched reliably."""
        if len(text) < self.min_chars:
            return False
        self._index(text)
        if self._disk is not None:
            self._disk.set(hashlib.sha256(text.encode()).hexdigest(), text)
        return True

    def add_many(self, texts: Iterable[str]) -> int:
        return sum(self.add(t) for t in texts)

    def refresh(self) -> None:
        """Pick up texts another process added to the persistent index."""
        if self._disk is not None:
            for key in self._disk.iterkeys():
                self._index(self._disk[key])

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_anchor.values())

    def __contains__(self, text: str) -> bool:
        return text in self._by_anchor.get(text[:ANCHOR], ())

    def _index(self, text: str) -> None:
        anchor = text[:ANCHOR]
        with self._lock:
            self._by_anchor.setdefault(anchor, set()).add(text)
            self._lengths.add(len(anchor))

    def find(self, prompt: str) -> list[tuple[int, int]]:
        """Non-overlapping [start, end) spans of indexed texts in ``prompt``, left to right,
        longest match first at each position."""
        with self._lock:
            by_anchor = {a: tuple(t) for a, t in self._by_anchor.items()}
            lengths = sorted(self._lengths, reverse=True)
        spans, i = [], 0
        while i < len(prompt):
            best = 0
            for n in lengths:
                for text in by_anchor.get(prompt[i:i + n], ()):
                    if len(text) > best and prompt.startswith(text, i):
                        best = len(text)
            if best:
                spans.append((i, i + best))
                i += best
            else:
                i += 1
        return spans

    def split(self, prompt: str) -> PromptSplit:
        """Split ``prompt`` at the indexed texts it contains; gaps between two found texts
        become chunks of their own so that nothing is dropped or reordered."""
        spans = self.find(prompt)
        if not spans:
            return PromptSplit(prompt, (), "", ())
        chunks, cached = [], []
        for k, (s, e) in enumerate(spans):
            if k and s > spans[k - 1][1]:
                chunks.append(prompt[spans[k - 1][1]:s])
                cached.append(False)
            chunks.append(prompt[s:e])
            cached.append(True)
        return PromptSplit(prompt[:spans[0][0]], tuple(chunks), prompt[spans[-1][1]:],
                           tuple(cached))
