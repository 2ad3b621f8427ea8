"""The client both framework integrations are thin layers over: one engine, the text index that
finds ingested chunks in flat prompts, the chunk format, the fallback policy and the last
request. A framework class only translates its types (Documents, nodes, messages, callbacks)
to and from these calls:

- ``ingest(texts)``: a hook's ingestion (``BlendChroma``, ``BlendKVTransform``): record the chunk
  texts for flat-prompt matching, then precompute their KVs and those of the separators that
  sit between them in a prompt, through the one ingestion path (``blendrag.ingest``);
- ``start(prompt, ...)``: one request: find the chunks in the prompt the chain built, lay it
  out, start the engine's token stream (a plain full prefill when no chunk is known:
  ``fallback.py``); ``finish(request)`` records it as the last one.

At ingestion the query prompts are not known yet, so chunk KVs are computed after the engine's
canonical ``chunk_prefix`` (docs/architecture.md, "Chunk prefix").
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationResult, GenerationStream, RequestStats
from blendrag.engine.request.prefill import Prefill
from blendrag.engine.views import MAX_VIEWS
from blendrag.ingest import IngestCounts
from blendrag.integration.chunks import ChunkFormat
from blendrag.integration.default_index import default_text_index, namespaced_index
from blendrag.integration.fallback import FallbackFixes, FallbackMonitor, IngestionMonitor
from blendrag.integration.flat_prompt import FlatLayout, find_layout
from blendrag.integration.ingest_texts import checked, ingest_texts
from blendrag.integration.ingestion_key import (
    KVIdentity,
    engine_persistence,
    require_chunk_prefix,
)
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.prompt import PromptBuilder
from blendrag.serving import ServedRequest, scheduler_for

PROGRESS_MIN = 32
"""Batches of at least this many chunks get a progress bar unless told otherwise."""


@dataclass
class BlendRequest:
    """One running request: its prompt layout (and how its chunks were found) and its token
    stream: the engine's own (run in the caller's thread), or the scheduler's handle (served
    with other requests; iterated from a thread or with ``async for``); ``result`` once the
    stream is exhausted."""

    prompt: FlatLayout
    stream: GenerationStream | ServedRequest
    asked: str = "blend"  # the mode the request asked for (it may have run a full prefill)

    @property
    def result(self) -> GenerationResult:
        if self.stream.result is None:
            raise RuntimeError("the request's stream is not exhausted yet")
        return self.stream.result

    @property
    def served(self) -> ServedRequest:
        """The scheduler's handle of a request started with ``served=True``."""
        if not isinstance(self.stream, ServedRequest):
            raise TypeError("the request runs in its caller's thread, not on the scheduler")
        return self.stream

    @property
    def blended(self) -> bool:
        """Whether the chunks' cached KVs were used (``reuse`` or ``blend``); False for a full
        prefill and for ``prefix`` mode, which takes the prompt's own prefix and first chunk
        instead (the stats count its rows)."""
        return self.result.stats.mode in ("reuse", "blend") and self.prompt.matched > 0

    def info(self) -> dict[str, Any]:
        """What the request did: finish reason, whether it blended, ``RequestStats`` (mode,
        chunk hits/misses, recompute fraction, TTFT, ...) and how the prompt was laid out
        (chunks matched, fallback cause)."""
        result = self.result
        return {"finish_reason": result.finish_reason, "blended": self.blended,
                "blendrag": result.stats.to_dict(), "blendrag_prompt": self.prompt.info()}


class BlendClient:
    """One engine as the framework integrations use it.

    ``text_index``: where ingested chunk texts are recorded (default: kept with the engine's KV
    store when it has a disk tier, so a new process finds them too; else in memory).
    ``chunk_format``: how a chunk is written into a prompt and what goes between two.
    ``fixes``: the framework's one-line fix of each fallback cause; ``name``: the LLM class
    named in fallback messages. ``namespace``: the tenant (or tenant/user) this client serves,
    set by the application (``BlendEngine.namespaced``; None: the engine's); its chunk texts are
    recorded apart from every other namespace's."""

    def __init__(self, engine: BlendEngine, text_index: ChunkTextIndex | None = None,
                 chunk_format: ChunkFormat | None = None, *, fixes: FallbackFixes,
                 name: str, namespace: str | None = None) -> None:
        if not isinstance(engine, BlendEngine):
            hint = (f" (build one: BlendEngine.from_pretrained({engine!r}))"
                    if isinstance(engine, str) else "")
            raise TypeError(f"engine must be a BlendEngine, got {type(engine).__name__}{hint}")
        if engine.prompts is None:
            raise ValueError("the engine has no tokenizer: framework LLMs need one to read text "
                             "prompts")
        self.prompts: PromptBuilder = engine.prompts
        self.engine = engine if namespace is None else engine.namespaced(namespace)
        self._own_index = text_index is not None  # given by the application
        self.text_index = (text_index if text_index is not None
                           else default_text_index(self.engine))
        self.chunk_format = chunk_format if chunk_format is not None else ChunkFormat()
        self.fixes, self.name = fixes, name
        self._fallback = FallbackMonitor()
        self._ingestion = IngestionMonitor()
        self.last_stats: RequestStats | None = None
        self.last_prompt: FlatLayout | None = None
        self._tenants: dict[str, BlendClient] = {}  # by namespace, least recently served first
        self._tenants_lock = threading.Lock()

    def fork(self, chunk_format: ChunkFormat | None = None) -> BlendClient:
        """The same engine, index and fixes (and format, unless given), with no request of its
        own yet: for a copy of the LLM that owns this client."""
        return BlendClient(self.engine, self.text_index, chunk_format or self.chunk_format,
                           fixes=self.fixes, name=self.name)

    @property
    def namespace(self) -> str:
        """The namespace this client serves."""
        return self.engine.store.namespace

    def serving(self, namespace: str | None) -> BlendClient:
        """This client, or the one serving ``namespace`` (per call: the application's choice)
        with the engine's view of that namespace and that namespace's own text index (its
        default one; next to an index the application gave this client); kept for the
        ``MAX_VIEWS`` namespaces most recently served."""
        if namespace is None or namespace == self.namespace:
            return self
        with self._tenants_lock:
            client = self._tenants.pop(namespace, None)
            if client is None:
                index = (namespaced_index(self.text_index, self.engine, namespace)
                         if self._own_index else None)  # else the namespace's default one
                client = BlendClient(self.engine, index, self.chunk_format, fixes=self.fixes,
                                     name=self.name, namespace=namespace)
            # the most recently served only, as the engine keeps its views (a server with a
            # namespace per user must not grow without end); a text index outlives its client
            self._tenants[namespace] = client
            while len(self._tenants) > MAX_VIEWS:
                self._tenants.pop(next(iter(self._tenants)))
        return client

    @property
    def fallbacks(self) -> int:
        """Requests that found no known chunk and ran as a plain full prefill."""
        return self._fallback.count

    # ---- ingestion -------------------------------------------------------------------------

    def ingest(self, texts: Sequence[str], *, profile: bool | int = False,
               separators: Sequence[str] | None = None, progress: bool | None = None,
               progress_min: int = PROGRESS_MIN) -> IngestCounts:
        """Precompute the KVs of chunk texts (as prompts spell them; in document order: each is
        a profile neighbour of the next) and those of the ``separators`` (default: the chunk
        format's) that sit behind them in a prompt, then record the texts for flat-prompt
        matching; every text is checked first (ValueError naming one the model cannot hold:
        nothing is then computed or recorded). Returns the counts of the chunks (separators not
        counted). ``progress``: a tqdm bar (None: for at least ``progress_min`` chunks with
        tokens)."""
        self.require_chunk_prefix()
        seps = [s for s in (self.chunk_format.separator,) if s] if separators is None else [
            s for s in separators if s]
        return ingest_texts(self.engine, self.prompts, texts, self.record, profile, seps,
                            progress, progress_min, self.name)

    def check(self, texts: Sequence[str]) -> None:
        """ValueError naming the first of ``texts`` that :meth:`ingest` would refuse (what a
        hook checks before it stores the texts elsewhere, e.g. in a vector store)."""
        self.require_chunk_prefix()
        checked(self.engine, self.prompts, texts)

    def record(self, texts: Sequence[str]) -> None:
        """Record chunk texts in the text index, formatted and bare: the last chunk of a stock
        chain's prompt may lack the template's tail, and a chat template may trim message
        content."""
        self.text_index.record([t for t in self.chunk_format.variants(texts)
                                if t not in self.text_index])

    def cached(self, texts: Sequence[str]) -> list[bool]:
        """Whether each chunk text's KV is in the engine's store now."""
        self.require_chunk_prefix()
        engine = self.engine
        prefix = self.prompts.chunk_prefix_ids()
        return [engine.store.contains(engine.key(prefix, self.prompts.encode(t))) for t in texts]

    def require_chunk_prefix(self) -> None:
        """ValueError unless the engine has a canonical ``chunk_prefix`` (framework hooks ingest
        chunks before any prompt exists)."""
        require_chunk_prefix(self.prompts)

    @property
    def kv_identity(self) -> str:
        """Hash of what a chunk's KV depends on besides its text (model, tokenizer, chunk prefix,
        ingestion context, chunk format): the cache identity of an ingestion step."""
        return KVIdentity.of_engine(self.engine).key(self.chunk_format)

    @property
    def persistence(self) -> str:
        """Where the KVs and texts of an ingestion end up: the same string in a new process only
        when both survive it (a disk, Redis or S3 KV tier, a persisted text index); otherwise
        unique to these objects. Part of the LlamaIndex transform's cache key, so that an
        ``IngestionCache`` skips the transform only when skipping loses nothing."""
        return engine_persistence(self.engine, self.text_index)

    # ---- requests --------------------------------------------------------------------------

    def start(self, prompt: str, blend: BlendConfig, generation: GenerationConfig, *,
              texts: Sequence[str] | None = None, templated: bool = False,
              strict: bool = False, served: bool = False) -> BlendRequest:
        """Lay ``prompt`` out at the retrieved chunks' ``texts`` when given (recorded for later
        flat prompts), else at the ingested texts, and start the engine's token stream; a plain
        full prefill when no chunk is found (warned once and counted, or
        ``NoChunkFoundError`` when ``strict``). ``templated``: the prompt already spells the chat
        template. TTFT counts from when the chunks were looked for. ``served``: queue it on the
        scheduler of the engine's model (blendrag.serving: batched with every other request
        served at the time) instead of running it in this thread."""
        flat = self.layout(prompt, texts=texts, templated=templated)
        if flat.full_only:
            if blend.mode == "full":  # asked for: not a fallback
                flat = dataclasses.replace(flat, fallback=None)
            else:
                self._fallback.check(flat, self.name, len(self.text_index), self.fixes, strict,
                                     len(texts or ()), self.namespace or "")
            blend = dataclasses.replace(blend, mode="full")  # nothing cached to blend
        started = time.perf_counter() - flat.match_s
        if served:
            def prepare(prefill: Prefill, match_s: float = flat.match_s) -> None:
                prefill.stats.timing.match_s = match_s
            handle = scheduler_for(self.engine).submit(self.engine, flat.layout, blend,
                                                       generation, started=started,
                                                       prepare=prepare)
            return BlendRequest(flat, handle, blend.mode)
        stream = self.engine.stream(flat.layout, blend, generation, started=started)
        stream.prefill.stats.timing.match_s = flat.match_s
        return BlendRequest(flat, stream, blend.mode)

    def layout(self, prompt: str, *, texts: Sequence[str] | None = None,
               templated: bool = False) -> FlatLayout:
        """The layout :meth:`start` runs ``prompt`` on, found the same way: at the retrieved
        chunks' ``texts`` when given (recorded for later flat prompts), else at the ingested
        texts; ``full_only`` when no chunk is found. Also what ``blendrag bench fidelity``
        measures, so that it runs exactly what the framework LLMs run."""
        if texts:
            self.record(texts)
        return find_layout(self.prompts, prompt, self.text_index, texts, templated)

    def finish(self, request: BlendRequest) -> dict[str, Any]:
        """Record a finished request as the last one; its info (finish reason, stats, layout)."""
        stats = request.result.stats
        request.prompt = request.prompt.after(stats.cache.hit_chunks,
                                              stats.cache.prefix_cache_tokens)
        backfilled = stats.cache.backfilled > 0  # ran full: passages in no store
        # prefix mode computes its chunk after the prompt's own prefix: ingestion stores none
        if request.asked != "prefix" and (request.blended
                                          or (backfilled and request.prompt.matched > 0)):
            self._ingestion.check(request.prompt, self.name, self.fixes, backfilled,
                                  self.namespace or "")
        self.last_stats, self.last_prompt = stats, request.prompt
        return request.info()

    def render_chat(self, turns: list[dict[str, str]]) -> str:
        """A conversation (``{"role", "content"}`` turns) as the model reads it: the tokenizer's
        chat template with the assistant header last, the engine's ``system`` message first
        when the turns have none."""
        system = self.prompts.system
        if system is not None and not any(t["role"] == "system" for t in turns):
            turns = [{"role": "system", "content": system}, *turns]
        return self.prompts.render_chat(turns)


class ClientViews:
    """What both framework LLMs expose of their ``BlendClient`` (``self._client``): a mixin,
    so each property is written once."""

    if TYPE_CHECKING:
        _client: BlendClient

    @property
    def client(self) -> BlendClient:
        """The framework-neutral client every request and ingestion goes through."""
        return self._client

    @property
    def last_stats(self) -> RequestStats | None:
        """Stats of the last finished request (a stream finishes when exhausted)."""
        return self._client.last_stats

    @property
    def last_prompt(self) -> FlatLayout | None:
        """Layout of the last finished request and how its chunks were found."""
        return self._client.last_prompt

    @property
    def fallbacks(self) -> int:
        """Requests that found no known chunk and ran as a plain full prefill."""
        return self._client.fallbacks
