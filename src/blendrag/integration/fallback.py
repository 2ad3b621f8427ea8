"""What a framework LLM does when a prompt holds no known chunk (it would run as a plain full
prefill): say why once, in a warning naming the cause and the framework's fix, count it, or
refuse it when the LLM is ``strict``; and when its passages were found but none had a stored
KV (the ingestion hook forgotten): say so once, with the fix.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from blendrag.integration.flat_prompt import FlatLayout

log = logging.getLogger(__name__)

FALLBACK_CAUSES = ("empty_index", "not_in_prompt", "documents_not_in_prompt")
"""Why a request found no known chunk: nothing was ingested into the LLM's text index; texts
were ingested but none is in this prompt; the request's own documents are not in it verbatim."""


class NoChunkFoundError(RuntimeError):
    """A ``strict`` framework LLM got a prompt with no known chunk (it would have run as a
    plain full prefill). Not a ValueError: LlamaIndex's refine synthesizer catches those and
    goes on with a logged warning, which would make ``strict`` silent again."""


@dataclass(frozen=True)
class FallbackFixes:
    """A framework's one-line fix for each cause of ``FALLBACK_CAUSES``, and for passages
    without a stored KV (``not_ingested``). ``{llm}`` in a fix is the LLM's class name."""

    empty_index: str
    not_in_prompt: str
    documents_not_in_prompt: str
    not_ingested: str


_CAUSES = {
    "empty_index": "its text index is empty: no chunk was ingested through it in this process",
    "not_in_prompt": "none of the {n} ingested chunk texts is in the prompt",
    "documents_not_in_prompt": "none of the request's {docs} retrieved texts is in the prompt "
                               "verbatim, nor any ingested chunk text",
}


class FallbackMonitor:
    """What one LLM does when a request finds no known chunk: a warning the first time (cause
    and fix), a count every time, or ``NoChunkFoundError`` when ``strict``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self._warned = False

    def check(self, flat: FlatLayout, llm: str, index_size: int, fixes: FallbackFixes,
              strict: bool, documents: int = 0, namespace: str = "") -> None:
        """Act on ``flat`` if it falls back (``flat.fallback`` set); ``namespace``: the
        request's (a namespace's text index and KVs are its own)."""
        if flat.fallback is None:
            return
        why = _CAUSES[flat.fallback].format(n=index_size, docs=documents) + _in(namespace)
        fix = getattr(fixes, flat.fallback).format(llm=llm)
        if strict:
            raise NoChunkFoundError(f"{llm}(strict=True) refuses a prompt without a known chunk "
                                    f"rather than run it as a plain full prefill: {why}. Fix: "
                                    f"{fix}")
        message = (f"{llm} found no known chunk in the prompt and runs a plain full prefill: "
                   f"{why}. Fix: {fix}")
        with self._lock:
            self.count += 1
            first, self._warned = not self._warned, True
        if first:
            log.warning("%s (said once per LLM; its `fallbacks` counts them, each response's "
                        "metadata says blended=False)", message)


class IngestionMonitor:
    """Warns once per LLM when a request's passages were found in the prompt but none had a
    stored KV: each was computed at query time, at the cost of a full prefill of it (an
    ingestion hook was left out). Later requests reuse what that one stored, so the first
    request that finds none is the one that can tell."""

    def __init__(self) -> None:
        self._warned = False

    def check(self, flat: FlatLayout, llm: str, fixes: FallbackFixes,
              backfilled: bool = False, namespace: str = "") -> None:
        """``backfilled``: the request ran an exact full prefill because its passages were in
        no store, and they are being computed off its path (the engine's backfill);
        ``namespace``: the request's."""
        # passages an earlier turn left in the prefix cache were not computed: not a miss
        computed = flat.matched - (flat.passage_head or 0)
        if flat.full_only or computed <= 0 or flat.passage_hits != 0 or self._warned:
            return
        self._warned = True
        happened = ("this request ran a full prefill and they are being computed in the "
                    "background" if backfilled else
                    "each was computed at query time, as slow as a full prefill of it")
        log.warning("%s: none of the %d passages in this request had a stored KV%s; %s "
                    "(stored then, so later requests reuse them). Fix: %s; or, if they were "
                    "ingested, they were ingested as other text (a stored KV is found by the "
                    "exact text: whitespace and document formatting count) (said once per "
                    "LLM)", llm, computed, _in(namespace), happened,
                    fixes.not_ingested.format(llm=llm))


def _in(namespace: str) -> str:
    """Where the request looked, when not in the default namespace: each namespace has its
    own text index and stored KVs, so what was ingested into another is not found."""
    if not namespace:
        return ""
    return (f" in namespace {namespace!r} (each namespace has its own ingested texts and KVs: "
            "ingest through an LLM or store of that namespace)")
