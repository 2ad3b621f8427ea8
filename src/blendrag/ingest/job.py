"""The bulk ingestion job: ingest every chunk text a source yields, once.

Resumable: chunks whose KV is already stored are skipped (one ``missing`` lookup per batch),
so a job that was interrupted, or run again on a grown collection, computes only what is new.
Several processes may run it on one store at once: every entry is written whole, and at worst
both compute the same chunk and write the same bytes.

Honest about what it stored: a chunk that was refused (not valid Unicode, longer than the
model's context) or computed but kept by no persistent tier of the store (a full or unusable
disk) is not counted as computed; each is listed in ``failures`` with the reason, and the job
goes on with the others. A text index that fails (a full disk) is reported the same way.
``IngestSummary.complete`` is False then (``blendrag precompute`` exits with status 1).

The texts go through the one ingestion path (``ingestion.Ingestion``) batch by batch. With
``profile=True`` each new chunk's context-sensitivity profile (``engine/caches/profile.py``) is
measured after the chunk before it in the source, its document neighbour (``profile=k``: after
each of the k before it), across batch boundaries.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sized
from dataclasses import asdict, dataclass
from typing import Protocol

from tqdm.auto import tqdm

from blendrag.ingest.ingestion import (
    ChunkFailure,
    IngestEngine,
    Ingestion,
    kv_bytes_per_token,
    nothing_to_ingest,
)

log = logging.getLogger("blendrag.ingest")

BATCH = 32
SHOWN_FAILURES = 10  # failures listed by format(); to_dict() has them all


class TextRecorder(Protocol):
    """Where the job also records the texts (a ``blendrag.integration.ChunkTextIndex``)."""

    def record(self, texts: Iterable[str]) -> int: ...


@dataclass(frozen=True)
class IngestSummary:
    """What one job did.

    chunks:   texts read from the source
    computed: KVs computed and stored (by a persistent tier of the store) by this job
    skipped:  texts whose KV was already stored (or that repeat an earlier text)
    empty:    texts with no tokens (nothing to store)
    tokens:   tokens of the computed (and stored) chunks
    bytes:    KV bytes computed (tokens x 2 x layers x kv_heads x head_dim x bytes per element)
    seconds:  wall time of the job (reading, tokenizing, computing, storing)
    profiled: computed chunks stored with a context-sensitivity profile (``profile=True``)
    refused:  texts refused before computing (not valid Unicode, longer than the context)
    not_stored: chunks computed that no persistent tier kept (a full or unusable disk)
    failures: one ``ChunkFailure`` (source position, reason, preview) per refused or not
              stored text
    text_index_error: why the text index stopped recording texts, if it did
    """

    chunks: int
    computed: int
    skipped: int
    empty: int
    tokens: int
    bytes: int
    seconds: float
    profiled: int = 0
    refused: int = 0
    not_stored: int = 0
    failures: tuple[ChunkFailure, ...] = ()
    text_index_error: str | None = None

    @property
    def complete(self) -> bool:
        """True when every text with tokens has its KV stored (and its text recorded)."""
        return not self.failures and self.text_index_error is None

    @property
    def nothing(self) -> str | None:
        """Why the source had nothing at all to ingest (no text, or none with a token); None
        when some text had a KV to store."""
        return nothing_to_ingest(self.chunks, self.empty)

    @property
    def tokens_per_s(self) -> float:
        """Computed tokens per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        """Every field, ``tokens_per_s`` and ``failed`` (chunks without a stored KV: refused or
        not stored), the count a distributed job's caller checks first."""
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "failed": len(self.failures)}

    def format(self) -> str:
        profiles = (f"; context-sensitivity profiles measured for {self.profiled}" if self.profiled
                    else "")
        line = (f"chunks {self.chunks}: computed {self.computed}, already stored {self.skipped}, "
                f"empty {self.empty}; "
                f"{self.tokens} tokens, {self.bytes / 2**20:.1f} MiB of KV in {self.seconds:.1f} s "
                f"({self.tokens_per_s:.0f} tokens/s){profiles}")
        if self.complete:
            return line
        lines = [line, f"NOT STORED: {len(self.failures)} chunks (refused {self.refused}, "
                       f"computed but not stored {self.not_stored})"]
        for f in self.failures[:SHOWN_FAILURES]:
            lines.append(f"  chunk {f.index} ({f.preview!r}): {f.reason}")
        if len(self.failures) > SHOWN_FAILURES:
            lines.append(f"  ... and {len(self.failures) - SHOWN_FAILURES} more")
        if self.text_index_error is not None:
            lines.append(f"text index: {self.text_index_error}")
        return "\n".join(lines)


def ingest_source(engine: IngestEngine, chunks: Iterable[str], prefix: str | None = None,
                  progress: bool = True,
                  text_index: TextRecorder | None = None, batch_size: int = BATCH,
                  profile: bool | int = False) -> IngestSummary:
    """Ingest every chunk text of ``chunks`` (a ``ChunkSource`` or any iterable of strings)
    whose KV is not stored yet.

    Chunks are tokenized as prompts tokenize them and computed after the engine's
    ``chunk_prefix`` or, without one, after ``prefix`` (the prompt prefix queries will use).
    ``text_index`` also records every text (framework LLMs find chunks in flat prompts with it).
    ``progress`` shows a tqdm bar (total from ``len(chunks)`` when it has one).

    ``profile``: also measure each computed chunk's context-sensitivity profile, for blending
    with ``BlendConfig(selector="profile")``: one more forward of neighbour + chunk per chunk
    (``profile=k``: after each of the k chunks before it, keeping each token's largest deviation).
    ``chunks`` must then come in document order: a chunk is measured after the non-empty chunks
    before it, across batch boundaries too. The first chunk has no predecessor and, as in
    ``BlendEngine.precompute``, is measured after the last chunk of its batch (not at all when
    that batch holds only it; the engine then measures it on first use). Chunks already stored
    are skipped as ever, so entries stored without a profile keep none (the engine measures
    them on first use)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(chunks, (str, bytes)):
        raise ValueError("chunks must be an iterable of chunk texts (a ChunkSource, a list), "
                         f"got a single {type(chunks).__name__}")
    # refuses a missing prefix or a bad profile now; lists refused texts and goes on
    run = Ingestion(engine, prefix, profile=profile, strict=False)
    total = len(chunks) if isinstance(chunks, Sized) else None
    t0 = time.perf_counter()
    index_error = None
    with tqdm(total=total, unit="chunk", desc="precompute", disable=not progress) as bar:
        run.on_chunk = lambda i, computed: _step(run, bar, t0)
        for texts in _batches(chunks, batch_size):
            skipped = run.counts.empty + run.counts.refused
            result = run.ingest(texts)
            bar.update(run.counts.empty + run.counts.refused - skipped)
            if text_index is not None and index_error is None:  # texts that have a KV
                index_error = record_texts(text_index, [t for t, r in zip(texts, result)
                                                   if r is not None])
    counts = run.counts
    # the chunk computed alone is stored too when the context keeps it for first passages
    entries = 2 if engine.context.stores_alone else 1
    return IngestSummary(chunks=counts.chunks, computed=counts.computed, skipped=counts.skipped,
                         empty=counts.empty,
                         tokens=counts.tokens,
                         bytes=entries * counts.tokens * kv_bytes_per_token(engine),
                         seconds=time.perf_counter() - t0, profiled=counts.profiled,
                         refused=counts.refused, not_stored=counts.not_stored,
                         failures=tuple(run.failures), text_index_error=index_error)


def record_texts(text_index: TextRecorder, texts: list[str]) -> str | None:
    """Record ``texts``; the reason when the index cannot (a full disk: OSError,
    sqlite3.Error), for ``IngestSummary.text_index_error`` (then a job stops recording)."""
    try:
        text_index.record(texts)
    except (OSError, sqlite3.Error) as exc:
        log.warning("text index failed (%s: %s); texts are no longer recorded", type(exc).__name__,
                    exc)
        return f"stopped recording texts: {type(exc).__name__}: {exc}"
    return None


def _step(run: Ingestion, bar: tqdm, t0: float) -> None:
    c = run.counts
    bar.update(1)
    bar.set_postfix(computed=c.computed, skipped=c.skipped,
                    tok_s=f"{c.tokens / max(time.perf_counter() - t0, 1e-9):.0f}", refresh=False)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
