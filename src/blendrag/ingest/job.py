"""The precompute job: compute and store the KV of every chunk a source yields, once.

Resumable: chunks whose KV is already stored are skipped (one ``missing`` lookup per batch),
so a job that was interrupted, or run again on a grown collection, computes only what is new.
Several processes may run it on one store at once: every entry is written whole, and at worst
both compute the same chunk and write the same bytes.

With ``profile=True`` each new chunk's context-sensitivity profile (``engine/profile.py``) is
measured after the chunk before it in the source, its document neighbour (``profile=k``: after
each of the k before it): every batch is handed to ``engine.precompute`` behind the previous
batches' last k chunks (stored already, so only their neighbour role counts), so batch
boundaries lose no neighbour.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

from tqdm.auto import tqdm

from blendrag.engine.engine import BlendEngine
from blendrag.engine.profile import profile_depth
from blendrag.text_index import ChunkTextIndex

BATCH = 32


@dataclass(frozen=True)
class PrecomputeSummary:
    """What one job did.

    chunks:   texts read from the source
    computed: KVs computed and stored by this job
    skipped:  texts whose KV was already stored (or that repeat an earlier text)
    empty:    texts with no tokens (nothing to store)
    tokens:   tokens whose KV was computed
    bytes:    KV bytes computed (tokens x 2 x layers x kv_heads x head_dim x bytes per element)
    seconds:  wall time of the job (reading, tokenizing, computing, storing)
    profiled: computed chunks stored with a context-sensitivity profile (``profile=True``)
    """

    chunks: int
    computed: int
    skipped: int
    empty: int
    tokens: int
    bytes: int
    seconds: float
    profiled: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Computed tokens per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}

    def format(self) -> str:
        profiles = f"; context-sensitivity profiles measured for {self.profiled}" if self.profiled else ""
        return (f"chunks {self.chunks}: computed {self.computed}, already stored {self.skipped}, empty {self.empty}; "
                f"{self.tokens} tokens, {self.bytes / 2**20:.1f} MiB of KV in {self.seconds:.1f} s "
                f"({self.tokens_per_s:.0f} tokens/s){profiles}")


def kv_bytes_per_token(engine: BlendEngine) -> int:
    """2 (K, V) x layers x kv_heads x head_dim x bytes per element."""
    a = engine.adapter
    return 2 * a.num_layers * a.num_kv_heads * a.head_dim * engine.dtype.itemsize


def precompute(engine: BlendEngine, chunks: Iterable[str], prefix: str | None = None, progress: bool = True,
               text_index: ChunkTextIndex | None = None, batch_size: int = BATCH,
               profile: bool | int = False) -> PrecomputeSummary:
    """Compute and store the KV of every chunk text not stored yet.

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
    if engine.prompts is None:
        raise ValueError("precompute needs an engine with a tokenizer")
    depth = profile_depth(profile)
    prefix_ids = engine.prompts.chunk_prefix_ids(prefix)  # raises early when there is no prefix at all
    total = len(chunks) if isinstance(chunks, Sized) else None
    t0 = time.perf_counter()
    counts = {"chunks": 0, "computed": 0, "skipped": 0, "empty": 0, "tokens": 0, "profiled": 0}
    previous: list[list[int]] = []  # the last non-empty chunks so far (up to depth): the next ones' neighbours
    with tqdm(total=total, unit="chunk", desc="precompute", disable=not progress) as bar:
        for texts in _batches(chunks, batch_size):
            previous = _run_batch(engine, prefix_ids, texts, counts, bar, t0, depth, previous)
            if text_index is not None:
                text_index.add_many(texts)
    return PrecomputeSummary(**counts, bytes=counts["tokens"] * kv_bytes_per_token(engine),
                             seconds=time.perf_counter() - t0)


def _run_batch(engine: BlendEngine, prefix_ids: list[int], texts: list[str], counts: dict[str, int],
               bar: tqdm, t0: float, depth: int, previous: list[list[int]]) -> list[list[int]]:
    """Compute one batch; returns the last ``depth`` non-empty chunks so far."""
    ids = [engine.prompts.encode(t) for t in texts]
    todo = [i for i in ids if i]
    counts["chunks"] += len(texts)
    counts["empty"] += len(texts) - len(todo)
    bar.update(len(texts) - len(todo))
    # With profiles, the previous batches' last chunks go first: the neighbours of this batch's
    # first chunks. They are stored already, so precompute skips them; they are not counted again.
    head = previous[-depth:] if depth else []
    profiled = depth > 0 and len(head) + len(todo) > 1  # precompute profiles no chunk of a list of one

    def done(i: int, computed: bool) -> None:
        if i < len(head):
            return
        counts["computed" if computed else "skipped"] += 1
        counts["tokens"] += len(todo[i - len(head)]) if computed else 0
        counts["profiled"] += computed and profiled
        bar.update(1)
        bar.set_postfix(computed=counts["computed"], skipped=counts["skipped"],
                        tok_s=f"{counts['tokens'] / max(time.perf_counter() - t0, 1e-9):.0f}", refresh=False)

    if todo:
        engine.precompute(prefix_ids, head + todo, profile=depth, on_chunk=done)
    return (head + todo)[-depth:] if depth else []


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
