"""One shard of a distributed precompute: texts in, one row per chunk out, nothing else.

``ingest_rows`` runs one batch of texts through the one ingestion path on a worker's engine and
returns, per chunk, only what the driver needs: its position, store key, token count, KV bytes
and status (with the reason when it has no stored KV), and why the text index failed, if it did
(the job goes on and reports it, as the local job does). The KVs themselves go straight into the
shared tier from the worker. ``summarize`` turns the rows of a whole job into the local job's
``IngestSummary``, so a distributed job reports exactly what ``ingest_source`` would.

``ingest_shard(settings, texts)`` is the same for frameworks blendrag does not depend on: a
plain function of picklable arguments, for Dask's ``client.map`` and Spark's ``mapPartitions``
(docs/scale.md). Resumable like the local job: chunks already stored are skipped before any
forward, so a shard run again computes only what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from blendrag.distributed.settings import IngestSettings, shared_engine
from blendrag.ingest.ingestion import ChunkFailure, IngestEngine, Ingestion, kv_bytes_per_token
from blendrag.ingest.job import IngestSummary, TextRecorder, record_texts

ROW_FIELDS = ("index", "key", "tokens", "bytes", "status", "reason", "preview",
              "text_index_error")
"""What each chunk's row holds: position in the job (-1: unknown), store key ("" for a chunk
with no tokens), tokens, KV bytes computed now (0 unless computed), status, for a chunk
without a stored KV the reason and the text's first characters, and why the text index could
not record its batch ("" when it could, or when there is none)."""
STATUSES = ("computed", "skipped", "empty", "refused", "not_stored")


def text_of(item: Any) -> str:
    """The chunk text of a dataset item: a str, a LangChain ``Document`` (``page_content``) or a
    LlamaIndex node (its ``MetadataMode.LLM`` content, what ``BlendLLM`` writes into prompts
    with the default chunk template)."""
    if isinstance(item, str):
        return item
    content = getattr(item, "page_content", None)
    if isinstance(content, str):
        return content
    if callable(getattr(item, "get_content", None)):
        from llama_index.core.schema import MetadataMode

        return item.get_content(metadata_mode=MetadataMode.LLM)
    raise ValueError(f"a chunk must be a str, a LangChain Document or a LlamaIndex node, got "
                     f"{type(item).__name__}")


def ingest_rows(engine: IngestEngine, texts: Sequence[str], *, prefix: str | None = None,
                indexes: Sequence[int] | None = None,
                text_index: TextRecorder | None = None) -> list[dict[str, Any]]:
    """Ingest one batch of ``texts`` on ``engine``; one row (``ROW_FIELDS``) per text.
    ``indexes``: each text's position in the whole job (default: -1, unknown). ``text_index``:
    also record the texts that have a stored KV; an index that fails (OSError, sqlite3.Error:
    a full disk) is reported in every row's ``text_index_error``, not raised (the KVs are
    stored)."""
    positions = list(indexes) if indexes is not None else [-1] * len(texts)
    if len(positions) != len(texts):
        raise ValueError(f"{len(positions)} indexes for {len(texts)} texts")
    run = Ingestion(engine, prefix, strict=False)
    ids: list[list[int] | str] = []
    for text in texts:
        try:
            ids.append(run.prompts.encode(text))
        except ValueError as exc:  # not valid Unicode: refused, as the local job does
            ids.append(str(exc))
    result = run.ingest_ids(ids, texts)
    failed = {f.index: f for f in run.failures}
    per_token = (2 if engine.context.stores_alone else 1) * kv_bytes_per_token(engine)
    rows = []
    for i, (chunk, done) in enumerate(zip(ids, result)):
        chunk_ids = [] if isinstance(chunk, str) else chunk
        tokens = len(chunk_ids)
        status = _status(done, failed.get(i))
        rows.append({"index": positions[i],
                     "key": engine.key(run.chunk_prefix_ids, chunk_ids) if tokens else "",
                     "tokens": tokens, "bytes": per_token * tokens if status == "computed" else 0,
                     "status": status,
                     "reason": failed[i].reason if i in failed else "",
                     "preview": failed[i].preview if i in failed else ""})
    error = None
    if text_index is not None:
        error = record_texts(text_index, [t for t, row in zip(texts, rows)  # with a stored KV
                                          if row["status"] in ("computed", "skipped")])
    for row in rows:
        row["text_index_error"] = error or ""
    return rows


def _status(done: bool | None, failure: ChunkFailure | None) -> str:
    # a failure first: a chunk computed but kept by no persistent tier has no stored KV
    if failure is not None:
        return "refused" if failure.reason.startswith("refused") else "not_stored"
    if done is None:  # no tokens: nothing to store
        return "empty"
    return "computed" if done else "skipped"


def summarize(rows: Iterable[dict[str, Any]], seconds: float) -> IngestSummary:
    """The ``IngestSummary`` of a job from its chunks' rows (in any order)."""
    counts = dict.fromkeys(STATUSES, 0)
    tokens = size = 0
    failures = []
    index_error = None
    for row in rows:
        if index_error is None and row.get("text_index_error"):  # "" when it recorded them
            index_error = str(row["text_index_error"])
        status = str(row["status"])
        counts[status] += 1
        if status == "computed":
            tokens += int(row["tokens"])
            size += int(row["bytes"])
        elif status in ("refused", "not_stored"):
            failures.append(ChunkFailure(int(row["index"]), str(row["reason"]),
                                         str(row["preview"])))
    failures.sort(key=lambda f: f.index)
    return IngestSummary(chunks=sum(counts.values()), computed=counts["computed"],
                         skipped=counts["skipped"], empty=counts["empty"], tokens=tokens,
                         bytes=size, seconds=seconds, refused=counts["refused"],
                         not_stored=counts["not_stored"], failures=tuple(failures),
                         text_index_error=index_error)


def ingest_shard(settings: IngestSettings, texts: Iterable[Any],
                 first_index: int = 0) -> IngestSummary:
    """Precompute one shard of a corpus in this process: the engine built from ``settings``
    once per process (later shards reuse it), the KVs written into ``settings.store``.
    ``texts``: chunk texts (or LangChain Documents, LlamaIndex nodes); ``first_index``: the
    shard's first position in the corpus (failures are numbered from it). A text index that
    fails stops recording and is reported (``text_index_error``). Merge the shards' summaries
    with ``combine``."""
    t0 = time.perf_counter()
    engine, text_index = shared_engine(settings)
    items = [text_of(t) for t in texts]
    rows: list[dict[str, Any]] = []
    for start in range(0, len(items), settings.batch_size):
        batch = items[start:start + settings.batch_size]
        done = ingest_rows(engine, batch, prefix=settings.prefix, text_index=text_index,
                           indexes=range(first_index + start, first_index + start + len(batch)))
        if done[0]["text_index_error"]:  # as the local job: stop recording, report it
            text_index = None
        rows += done
    return summarize(rows, time.perf_counter() - t0)


def combine(parts: Iterable[IngestSummary], seconds: float | None = None) -> IngestSummary:
    """One summary of shards run side by side; ``seconds``: the job's wall time (default: the
    longest shard's)."""
    parts = list(parts)
    total = {name: sum(getattr(p, name) for p in parts)
             for name in ("chunks", "computed", "skipped", "empty", "tokens", "bytes",
                          "profiled", "refused", "not_stored")}
    failures = tuple(sorted((f for p in parts for f in p.failures), key=lambda f: f.index))
    errors = [p.text_index_error for p in parts if p.text_index_error is not None]
    wall = seconds if seconds is not None else max((p.seconds for p in parts), default=0.0)
    return IngestSummary(**total, seconds=wall, failures=failures,
                         text_index_error=errors[0] if errors else None)
