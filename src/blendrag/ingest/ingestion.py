"""The one ingestion path: chunk texts -> token ids -> ``engine.precompute``.

Texts are *ingested*: tokenized with the engine's ``PromptBuilder`` exactly as prompts tokenize
them, then their token ids are *precomputed*: ``BlendEngine.precompute`` stores each chunk's KV
computed after the chunk prefix. Every entry point goes through ``Ingestion``:
``BlendEngine.ingest``, the bulk job (``ingest_source``, ``blendrag precompute``), LangChain's
``BlendChroma`` and LlamaIndex's ``BlendKVTransform`` (the last two through
``blendrag.integration``'s client).

A chunk that cannot have a KV is refused before anything is computed: a text that is not valid
Unicode (a lone surrogate) and a chunk longer than the model's context leaves after the chunk
prefix. (A chunk that fits after the chunk prefix but not after the ingestion context's
longest filler is stored computed after the chunk prefix alone, as a request computes it:
``ChunkCache.context_for``.) ``strict`` runs (the default:
``BlendEngine.ingest``, the framework integrations) raise ``ValueError``; the bulk job lists
them in ``failures`` and goes on. A strict run with nothing at all to ingest (no text, none
with a token) raises ``ValueError`` saying so (``IngestCounts.nothing``; ``blendrag precompute``
exits with 2). After each batch the computed chunks are looked up in the store's persistent
tiers: one that no tier kept (a full or unusable disk) is not counted as computed, has no
stored KV (None, as a refused text) and is listed in ``failures`` with the store's reason.

An ``Ingestion`` may take its texts in several batches (``ingest``): with profiles (``profile=k``,
``engine/caches/profile.py``) the last k non-empty chunks of the earlier batches go in front of
the next batch, stored already and therefore skipped, as the profile neighbours of its first
chunks; so batch boundaries lose no neighbour. A text without any token has no KV: it is
counted as empty and left out.

This package sits below the engine: it uses an engine through ``IngestEngine`` and never imports
``blendrag.engine``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from blendrag.config import profile_depth

if TYPE_CHECKING:
    import torch

    from blendrag.prompt import PromptBuilder
    from blendrag.store.protocol import KVStore

OnChunk = Callable[[int, bool], None]
"""``on_chunk(i, computed)``: called after text ``i`` of an ``ingest`` call (not for empty
texts)."""


class IngestContext(Protocol):
    """What ingestion reads of the engine's ingestion context (``ChunkContext``)."""

    @property
    def stores_alone(self) -> bool: ...  # two entries per chunk


class IngestEngine(Protocol):
    """What ingestion uses of a ``BlendEngine``."""

    prompts: PromptBuilder | None

    @property
    def adapter(self) -> Any: ...  # num_layers, num_kv_heads, head_dim, max_positions

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def store(self) -> KVStore: ...

    @property
    def context(self) -> IngestContext: ...

    def key(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int]) -> str: ...

    def precompute(self, chunk_prefix_ids: Sequence[int], chunks: Sequence[Sequence[int]], *,
                   profile: bool | int = False, on_chunk: OnChunk | None = None) -> list[bool]: ...


@dataclass
class IngestCounts:
    """What an ingestion did so far.

    chunks:   texts given
    computed: KVs computed and stored now (by a persistent tier, where the store has one)
    skipped:  texts whose KV was already stored (or that repeat an earlier text)
    empty:    texts with no tokens (nothing to store)
    tokens:   tokens of the computed chunks
    profiled: computed chunks stored with a context-sensitivity profile
    refused:  texts refused before computing (not valid Unicode, longer than the context)
    not_stored: chunks computed but kept by no persistent tier of the store
    """

    chunks: int = 0
    computed: int = 0
    skipped: int = 0
    empty: int = 0
    tokens: int = 0
    profiled: int = 0
    refused: int = 0
    not_stored: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def nothing(self) -> str | None:
        """Why there was nothing at all to ingest (``nothing_to_ingest``); None otherwise."""
        return nothing_to_ingest(self.chunks, self.empty)

    def __iadd__(self, other: IngestCounts) -> IngestCounts:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)
        return self


def nothing_to_ingest(chunks: int, empty: int) -> str | None:
    """Why ``chunks`` texts, ``empty`` of them without a token, had nothing to store, or None."""
    if chunks == 0:
        return "no chunk text was given: nothing to ingest"
    if empty == chunks:
        return (f"none of the {chunks} chunk text{'s' if chunks > 1 else ''} has a token (empty "
                "text): nothing to ingest")
    return None


@dataclass(frozen=True)
class ChunkFailure:
    """A text that has no stored KV after ingestion, and why.

    index:  position of the text among all the texts of the run (0-based)
    reason: why (refused, or not stored and the store's explanation)
    preview: the text's first characters
    """

    index: int
    reason: str
    preview: str = ""


class Ingestion:
    """One ingestion run on ``engine``: chunk KVs computed after the engine's ``chunk_prefix``,
    else after ``prefix`` (the prompt prefix queries will use); ValueError when there is neither.

    ``profile``: also measure each new chunk's context-sensitivity profile, after the chunk
    before it (``profile=k``: after each of the k before it), across ``ingest`` calls; the first
    chunk of the run is measured after the last ones of its batch (not at all when that batch
    holds only it; the engine then measures it on first use).
    ``on_chunk(i, computed)``: progress, after each non-empty text ``i`` of an ``ingest`` call.
    ``strict``: a refused text raises ``ValueError`` (before anything of its batch is
    computed); else it is listed in ``failures`` and the others go on.
    """

    def __init__(self, engine: IngestEngine, prefix: str | None = None, *,
                 profile: bool | int = False,
                 on_chunk: OnChunk | None = None, strict: bool = True) -> None:
        if engine.prompts is None:
            raise ValueError("ingestion needs an engine with a tokenizer")
        self.engine = engine
        self.prompts: PromptBuilder = engine.prompts
        self.depth = profile_depth(profile)
        # raises early without a prefix
        self.chunk_prefix_ids = self.prompts.chunk_prefix_ids(prefix)
        self.on_chunk = on_chunk
        self.strict = strict
        self.counts = IngestCounts()
        self.failures: list[ChunkFailure] = []
        self.max_chunk_tokens = _max_chunk_tokens(engine, self.chunk_prefix_ids)
        why = engine.store.unwritable()
        if why is not None:  # said before anything is computed, not after every chunk
            raise ValueError(f"the KV store cannot keep what ingestion computes: {why}. Give it "
                             "a folder this process can write (StoreConfig(disk_dir=...), "
                             "--store-dir) or a reachable Redis")
        # the last non-empty chunks so far: the next ones' neighbours
        self._previous: list[list[int]] = []

    def ingest(self, texts: Sequence[str]) -> list[bool | None]:
        """Ingest one batch of texts; per text: True (KV computed and stored now), False (already
        stored) or None (no stored KV: no tokens, refused or computed but kept by no persistent
        tier, see ``failures``)."""
        if isinstance(texts, (str, bytes)):
            raise ValueError("texts must be a sequence of chunk texts, got a single "
                             f"{type(texts).__name__} (wrap it in a list)")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"text {self.counts.chunks + i} is a {type(text).__name__}, not "
                                 "a str")
        ids: list[list[int] | str] = []
        for text in texts:
            try:
                ids.append(self.prompts.encode(text))
            except ValueError as exc:  # not valid Unicode: refused like a chunk too long
                ids.append(str(exc))
        return self.ingest_ids(ids, texts)

    def ingest_ids(self, chunks: Sequence[Sequence[int] | str],
                texts: Sequence[str] | None = None) -> list[bool | None]:
        """``ingest`` for texts tokenized already (a str in place of ids: a text refused with that
        reason; ``texts``: the texts, for the previews in ``failures``)."""
        base = self.counts.chunks
        refused = self._refusals(chunks, texts, base)
        todo = [i for i, ids in enumerate(chunks) if i not in refused and len(ids)]
        valid: dict[int, list[int]] = {i: [int(t) for t in chunks[i]] for i in todo}
        counts = self.counts
        counts.chunks += len(chunks)
        counts.refused += len(refused)
        counts.empty += len(chunks) - len(todo) - len(refused)
        # The previous batches' last chunks go first: stored already, they are skipped and not
        # counted again; they are the neighbours of this batch's first chunks.
        head = self._previous[-self.depth:] if self.depth else []
        batch = [*head, *(valid[i] for i in todo)]
        # precompute profiles no chunk of a list of one
        profiled = self.depth > 0 and len(batch) > 1
        result: list[bool | None] = [None] * len(chunks)

        def done(k: int, computed: bool) -> None:
            if k < len(head):
                return
            i = todo[k - len(head)]
            result[i] = computed
            counts.computed += computed
            counts.skipped += not computed
            counts.tokens += len(valid[i]) if computed else 0
            counts.profiled += computed and profiled
            if self.on_chunk is not None:
                self.on_chunk(i, computed)

        if todo:
            self.engine.precompute(self.chunk_prefix_ids, batch, profile=self.depth, on_chunk=done)
            lost = self._check_stored([i for i in todo if result[i]], valid, texts, base,
                                      profiled)
            for i in lost:  # computed, but nothing kept it: no stored KV, as for a refusal
                result[i] = None
        self._previous = batch[-self.depth:] if self.depth else []
        if self.strict and counts.nothing is not None:  # the whole run so far, not this batch
            raise ValueError(counts.nothing)
        return result

    def _refusals(self, chunks: Sequence[Sequence[int] | str], texts: Sequence[str] | None,
                  base: int) -> set[int]:
        """Indexes of the chunks refused before computing; raises in a strict run."""
        limit = self.max_chunk_tokens
        found = []
        for i, ids in enumerate(chunks):
            if isinstance(ids, str):
                found.append((i, f"refused: {ids}"))
            elif len(ids) > limit:
                found.append((i, f"refused: {len(ids)} tokens, longer than the {limit} the "
                                 f"model's context of {self.engine.adapter.max_positions} "
                                 "positions leaves after the chunk prefix"))
        if found and self.strict:
            i, reason = found[0]
            raise ValueError(f"text {base + i} {reason}" + (
                f" (and {len(found) - 1} more)" if len(found) > 1 else ""))
        for i, reason in found:
            self.failures.append(ChunkFailure(base + i, reason, _preview(texts, i)))
        return {i for i, _ in found}

    def _check_stored(self, computed: list[int], chunks: dict[int, list[int]],
                      texts: Sequence[str] | None, base: int, profiled: bool) -> list[int]:
        """Move the computed chunks that no persistent tier kept from ``computed`` to
        ``not_stored``, with the store's reason, into ``failures``; returns their indexes."""
        store = self.engine.store
        keys = {self.engine.key(self.chunk_prefix_ids, chunks[i]): i for i in computed}
        lost = store.unpersisted(list(keys))
        if not lost:
            return []
        problems = store.problems()
        reason = ("not stored: " + "; ".join(problems) if problems else
                  "not stored: no persistent tier kept it (larger than the tier's budget?)")
        for key in lost:
            i = keys[key]
            self.counts.computed -= 1
            self.counts.tokens -= len(chunks[i])
            self.counts.profiled -= profiled
            self.counts.not_stored += 1
            self.failures.append(ChunkFailure(base + i, reason, _preview(texts, i)))
        return [keys[key] for key in lost]


def _max_chunk_tokens(engine: IngestEngine, chunk_prefix_ids: Sequence[int]) -> int:
    """Longest chunk whose KV fits the model's context after the chunk prefix (a chunk too
    long for the ingestion context's fillers too is computed without them); raises when the
    chunk prefix leaves no room at all."""
    room = engine.adapter.max_positions - len(chunk_prefix_ids)
    if room < 1:
        raise ValueError(f"the chunk prefix takes {len(chunk_prefix_ids)} tokens of the "
                         f"model's context of {engine.adapter.max_positions} positions: no room "
                         "is left for a chunk (use a shorter system prompt or chunk prefix)")
    return room


def _preview(texts: Sequence[str] | None, i: int, n: int = 40) -> str:
    if texts is None:
        return ""
    text = texts[i].encode("utf-8", "replace").decode("utf-8")
    return text[:n] + ("…" if len(text) > n else "")


def kv_bytes_per_token(engine: IngestEngine) -> int:
    """2 (K, V) x layers x kv_heads x head_dim x bytes per element."""
    a = engine.adapter
    return 2 * a.num_layers * a.num_kv_heads * a.head_dim * engine.dtype.itemsize
