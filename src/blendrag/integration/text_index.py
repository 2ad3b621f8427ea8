"""Find ingested chunk texts inside a flat prompt string, in time proportional to the prompt.

Stock chains (LangChain's stuff-documents chain, LlamaIndex synthesizers) hand the LLM one
string. To blend it anyway, the ingestion hooks record every chunk text here, and the LLM
splits the prompt at the chunk texts it contains: no separator string is asked of the user.

How (docs/matching.md has the measurements): each text is keyed by the hash of its first
``ANCHOR`` characters (texts shorter than that: of their first ``min_chars``) and by the hash of
the whole text (``span_hash``). A request hashes every window of the prompt at once (numpy, one
pass per anchor length), keeps the windows whose anchor bit is set in a bitmap (a few false
positives per thousand windows), and at those positions only checks the lengths of the texts
with that anchor: one O(1) span hash and one set lookup each. Nothing depends on how many
texts are indexed, except the bitmap's false-positive rate, which its growth keeps bounded. The
index holds hashes, not texts: a million chunks cost memory for their hashes only (a persisted
index keeps the texts on disk, ``text_rows``: signed, and encrypted if asked, where the store
has keys). The span hashes live in memory only; what is persisted is keyed.

Matches are leftmost, longest first at a position, never overlapping: the same rule as
:func:`find_texts` (the texts given with a request), so both give the same split.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from blendrag.integration.span_hash import SpanHasher, text_hash, with_length, with_lengths
from blendrag.store.auth import StoreKeys
from blendrag.store.config import StoreConfig

log = logging.getLogger(__name__)

ANCHOR = 64
"""Anchor length of texts at least this long (long anchors: texts sharing a head stay apart)."""
_FIB = np.uint64(0x9E3779B97F4A7C15)
_BITS_MIN, _BITS_MAX = 16, 30  # bitmap sizes, log2 of bits (8 KiB .. 128 MiB)
_LOAD = 64  # bits per anchor before the bitmap grows (false positives ~ 1/64 at worst)
_BATCH = 20_000
PROGRESS_MIN = 100_000
"""Loading at least this many persisted texts shows a progress bar."""


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
    """Chunk texts found in prompts by hash; persisted under the folder ``path`` when given
    (SQLite rows, shared by processes; see ``text_rows``).

    ``min_chars``: shorter texts are not recorded (they would match by chance).
    ``show_progress``: progress bar while loading a persisted index (None: from
    ``PROGRESS_MIN`` texts). ``keys``: the store's ``StoreKeys``: persisted rows are signed
    (one planted in the file is never used), their digests keyed, and with ``encrypt`` their
    texts encrypted at rest; ``namespace``: the store namespace id the rows are bound to (a row
    copied from another tenant's index does not verify). The KV store's ``StoreConfig`` gives
    all three: ``integration.default_index.default_text_index`` passes them.
    """

    def __init__(self, path: str | Path | None = None, min_chars: int = 16,
                 show_progress: bool | None = None, *, keys: StoreKeys | None = None,
                 encrypt: bool = False, namespace: str = "") -> None:
        if min_chars < 1:
            raise ValueError(f"min_chars must be >= 1, got {min_chars}")
        if encrypt and keys is None:
            raise ValueError("ChunkTextIndex(encrypt=True) needs the store's keys (keys=...)")
        self.min_chars = min_chars
        self.path = Path(path) if path is not None else None
        self._short = min(min_chars, ANCHOR)
        self._lock = threading.Lock()  # writers; readers (find) use snapshots, no lock
        self._keys: set[int] = set()  # hash of each whole text, with its length
        self._anchors: dict[int, int | tuple[int, ...]] = {}  # anchor key -> text lengths
        self._anchor_lengths: dict[int, int] = {}  # anchor length -> texts using it
        self._bitmap = (np.zeros(1 << (_BITS_MIN - 3), dtype=np.uint8), _BITS_MIN)
        self._rows = None
        self._last_row = 0
        if self.path is not None:
            from blendrag.integration.text_rows import TextRows

            self._rows = TextRows(self.path, keys=keys, encrypt=encrypt, namespace=namespace)
            self._load(show_progress)

    # -- recording ---------------------------------------------------------------------------

    def record(self, texts: Iterable[str]) -> int:
        """Record texts (persisted when the index has a path; those recorded already are
        skipped); returns how many were long enough to be matched reliably (already recorded
        ones included). Persisted first, then found in memory: a write that fails (a store
        locked by another process, a full disk) records nothing, so the same call again
        records them. A text that is not valid Unicode (a lone surrogate: no prompt holds it,
        since no tokenizer reads it) is left out, with a warning."""
        if isinstance(texts, str):
            raise ValueError("record takes a sequence of texts, not one str (wrap it in a list)")
        long_enough = [t for t in texts if isinstance(t, str) and len(t) >= self.min_chars]
        valid = [t for t in long_enough if _unicode(t)]
        if len(valid) < len(long_enough):
            log.warning("text index: left out %d text(s) that are not valid Unicode (a lone "
                        "surrogate)", len(long_enough) - len(valid))
        for start in range(0, len(valid), _BATCH):
            batch = valid[start:start + _BATCH]
            if self._rows is not None:
                self._rows.insert(batch)  # those already there are skipped
            self._index(batch)
        return len(valid)

    def refresh(self) -> None:
        """Pick up texts another process added to the persisted index."""
        if self._rows is not None:
            self._load(False)

    def _load(self, show_progress: bool | None) -> None:
        rows = self._rows
        if rows is None:
            return
        total = rows.count_after(self._last_row)
        show = total >= PROGRESS_MIN if show_progress is None else show_progress
        batch: list[str] = []
        with tqdm(total=total, desc="loading chunk text index", unit="text",
                  disable=not show) as bar:
            for row_id, text in rows.rows_after(self._last_row):
                self._last_row = row_id
                if len(text) >= self.min_chars:
                    batch.append(text)
                if len(batch) >= _BATCH:
                    self._index(batch)
                    bar.update(len(batch))
                    batch = []
            self._index(batch)
            bar.update(len(batch))

    def _index(self, texts: Sequence[str]) -> list[str]:
        """Hash texts in one vectorised pass and record them; returns those not known before."""
        if not texts:
            return []
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        hasher = SpanHasher("".join(texts))
        anchor_len = np.where(lengths >= ANCHOR, ANCHOR, self._short)
        keys = with_lengths(hasher.spans(starts, lengths), lengths).tolist()
        anchors = with_lengths(hasher.spans(starts, anchor_len), anchor_len)
        new = []
        with self._lock:
            for text, key, anchor, n, a_len in zip(texts, keys, anchors.tolist(),
                                                   lengths.tolist(), anchor_len.tolist()):
                if key in self._keys:
                    continue
                self._keys.add(key)
                self._anchor_lengths[a_len] = self._anchor_lengths.get(a_len, 0) + 1
                known = self._anchors.get(anchor)
                if known is None:
                    self._anchors[anchor] = n
                else:
                    known = known if isinstance(known, tuple) else (known,)
                    self._anchors[anchor] = tuple(sorted({*known, n}, reverse=True))
                new.append(text)
            self._set_bits(anchors)
        return new

    def _set_bits(self, anchors: np.ndarray) -> None:
        bits, log2 = self._bitmap
        needed = max(_BITS_MIN, min(_BITS_MAX, (len(self._anchors) * _LOAD).bit_length()))
        if needed > log2:  # grow: rebuild from every anchor, then swap in one assignment
            bits, log2 = np.zeros(1 << (needed - 3), dtype=np.uint8), needed
            anchors = np.fromiter(self._anchors.keys(), dtype=np.uint64, count=len(self._anchors))
        slot = _slots(anchors, log2)
        np.bitwise_or.at(bits, slot >> np.uint64(3),
                         np.left_shift(np.uint8(1), (slot & np.uint64(7)).astype(np.uint8)))
        self._bitmap = (bits, log2)

    # -- lookups -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, text: object) -> bool:
        return (isinstance(text, str) and len(text) >= self.min_chars
                and with_length(text_hash(text), len(text)) in self._keys)

    def find(self, prompt: str) -> list[tuple[int, int]]:
        """Non-overlapping [start, end) spans of indexed texts in ``prompt``, left to right,
        longest match first at each position."""
        if not self._keys or not prompt:
            return []
        hasher = SpanHasher(prompt)
        bits, log2 = self._bitmap
        positions, anchor_keys = [], []
        for a_len, count in list(self._anchor_lengths.items()):
            if not count or a_len > hasher.n:
                continue
            keys = with_lengths(hasher.windows(a_len), np.full(1, a_len))
            slot = _slots(keys, log2)
            hit = np.flatnonzero((bits[slot >> np.uint64(3)] >> (slot & np.uint64(7))) & 1)
            positions.append(hit)
            anchor_keys.append(keys[hit])
        if not positions:
            return []
        pos = np.concatenate(positions)
        order = np.argsort(pos, kind="stable")
        candidates = zip(pos[order].tolist(), np.concatenate(anchor_keys)[order].tolist())
        spans: list[tuple[int, int]] = []
        best_at, best, cursor = -1, 0, 0
        for i, anchor in candidates:
            if i != best_at:  # a new position: settle the previous one
                if best:
                    spans.append((best_at, best_at + best))
                    cursor = best_at + best
                best_at, best = i, 0
            if i < cursor:
                continue
            best = max(best, self._longest(hasher, i, anchor))
        if best and best_at >= cursor:
            spans.append((best_at, best_at + best))
        return spans

    def _longest(self, hasher: SpanHasher, i: int, anchor: int) -> int:
        """Length of the longest indexed text at ``i`` among those with this anchor (0: none)."""
        lengths = self._anchors.get(anchor)
        if lengths is None:  # a false positive of the bitmap
            return 0
        for n in (lengths,) if isinstance(lengths, int) else lengths:  # longest first
            if i + n <= hasher.n and with_length(hasher.span(i, n), n) in self._keys:
                return n
        return 0

    def split(self, prompt: str) -> PromptSplit:
        """Split ``prompt`` at the indexed texts it contains; gaps between two found texts
        become chunks of their own so that nothing is dropped or reordered."""
        return split_spans(prompt, self.find(prompt))


def _slots(keys: np.ndarray, log2: int) -> np.ndarray:
    """Bitmap slot of each key (multiplicative hashing: the top ``log2`` bits)."""
    with np.errstate(over="ignore"):
        return (keys * _FIB) >> np.uint64(64 - log2)


def find_texts(prompt: str, texts: Iterable[str]) -> list[tuple[int, int]]:
    """Spans of the given texts in ``prompt`` (a request's few retrieved texts, however short),
    by the rule of :meth:`ChunkTextIndex.find`: leftmost, longest first, non-overlapping."""
    longest: dict[int, int] = {}
    for text in set(texts):
        if not text:
            continue
        i = prompt.find(text)
        while i >= 0:
            longest[i] = max(longest.get(i, 0), len(text))
            i = prompt.find(text, i + 1)
    spans, cursor = [], 0
    for i in sorted(longest):
        if i >= cursor:
            spans.append((i, i + longest[i]))
            cursor = i + longest[i]
    return spans


def index_for_store(path: str | Path, config: StoreConfig,
                    ns_id: str | None = None) -> ChunkTextIndex:
    """A text index persisted in ``path`` under the keys of the store ``config`` describes:
    rows signed (and texts sealed where it encrypts) when it has keys, bound to the namespace
    id ``ns_id`` (None: the config's namespace); what a precompute job, a worker and a
    framework LLM all record into."""
    keys = config.auth_key
    return ChunkTextIndex(path, keys=keys, encrypt=config.encrypt and keys is not None,
                          namespace=config.names.ns_id if ns_id is None else ns_id)


def split_spans(prompt: str, spans: Sequence[tuple[int, int]]) -> PromptSplit:
    """``prompt`` cut at ``spans`` (sorted, non-overlapping); the gaps between spans are chunks
    too (``cached`` False)."""
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


def _unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (encodes as UTF-8: no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
