"""What a framework hook does with the chunk texts it ingests (``BlendClient.ingest``): every
text checked before anything is stored, their KVs precomputed, then the texts recorded for
flat-prompt matching; a chunk that no persistent tier kept is said in a warning.

Checked first because a hook stores elsewhere too: ``BlendChroma.add_texts`` checks before
Chroma keeps the documents, so that one text the model cannot hold leaves neither vectors nor
recorded texts behind (a retry would add the documents twice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from blendrag.ingest import IngestCounts, Ingestion
from blendrag.prompt import PromptBuilder

log = logging.getLogger(__name__)


def checked(engine, prompts: PromptBuilder, texts: Sequence[str],
            profile: bool | int = False) -> tuple[Ingestion, list[list[int]]]:
    """The ingestion run and each text's ids; ValueError naming the first text that cannot
    be ingested (not a str, not valid Unicode, longer than the model's context leaves after
    the chunk prefix), or a store that cannot keep KVs, before anything is computed or
    stored."""
    if isinstance(texts, (str, bytes)):
        raise ValueError("texts must be a sequence of chunk texts, not one str (wrap it in a "
                         "list)")
    run = Ingestion(engine, profile=profile)
    ids = []
    for i, text in enumerate(texts):
        try:
            ids.append(prompts.encode(text))
        except ValueError as exc:
            raise ValueError(f"text {i} cannot be ingested: {exc}") from None
        if len(ids[-1]) > run.max_chunk_tokens:
            raise ValueError(f"text {i} cannot be ingested: {len(ids[-1])} tokens, longer than "
                             f"the {run.max_chunk_tokens} the model's context of "
                             f"{engine.adapter.max_positions} positions leaves after the chunk "
                             "prefix (split it into passages)")
    return run, ids


def ingest_texts(engine, prompts: PromptBuilder, texts: Sequence[str], record: Callable,
                 profile: bool | int, separators: Sequence[str], progress: bool | None,
                 progress_min: int, llm: str) -> IngestCounts:
    """Check ``texts`` (``checked``), precompute their KVs (in document order: each is a
    profile neighbour of the next) and those of ``separators``, then ``record`` the texts;
    the counts of the texts (separators not counted)."""
    run, ids = checked(engine, prompts, texts, profile)
    todo = sum(1 for i in ids if i)  # a text without tokens has no KV
    counts = IngestCounts(chunks=len(ids), empty=len(ids))
    if todo:
        show = todo >= progress_min if progress is None else progress
        with tqdm(total=todo, desc="precomputing chunk KVs", unit="chunk",
                  disable=not show) as bar:
            run.on_chunk = lambda i, computed: bar.update(1)
            run.ingest_ids(ids)
        counts = IngestCounts(**run.counts.to_dict())
        run.on_chunk = None
        if separators:
            run.ingest(list(separators))
    record(texts)  # once computed: a text refused above is recorded nowhere
    if counts.not_stored:
        failures = "; ".join(f"text {f.index}: {f.reason}" for f in run.failures[:3])
        log.warning("%s: %d of %d chunks were computed but no persistent tier kept their KV "
                    "(%s); requests compute them again until a tier keeps them", llm,
                    counts.not_stored, len(ids), failures)
    return counts
