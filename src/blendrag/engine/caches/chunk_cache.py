"""The chunk cache: the one part of the engine that touches the store.

Every cached KV a request or an ingestion needs goes through ``ChunkCache``: its content key
(``kv/keys.py``), one lookup path (``open``: the stored entry opened for layer-wise reads, its
header checked against what was asked for), computing and storing what the store misses (in
the ingestion context, with the first passage's exact rows beside it: ``engine/caches/context.py``),
and the priors a selector reads (a profile measured on first use: ``engine/caches/profile.py``).
Computing uses the runner's pooled request buffer, so it happens before a request takes it:
``rows_for`` (a request's rows, filled by engine/caches/request_rows.py) is the first step of a
request.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection, Sequence

from blendrag.config import BlendConfig, profile_depth
from blendrag.engine.caches.backfill import Backfill, Piece
from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext, in_context
from blendrag.engine.caches.device_tier import DeviceTier
from blendrag.engine.caches.history import HistoryRows
from blendrag.engine.caches.profile import neighbours, profiled
from blendrag.engine.caches.request_rows import RequestRows, fill, request_chunks
from blendrag.engine.compute.runner import ModelRunner
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.keys import ModelIdentity, chunk_key, hash_ids
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayeredEntry, LayerReadError
from blendrag.store.protocol import KVStore

log = logging.getLogger(__name__)

Ids = Sequence[int]


class ChunkCache:
    """Chunk KVs of one model in ``store``, computed by ``runner`` on a miss.

    ``context``: what stored chunk rows are computed after (``engine/caches/context.py``);
    ``encode``: text -> ids, for the fillers of a context (None: an engine without a tokenizer,
    whose context has no fillers)."""

    def __init__(self, store: KVStore, runner: ModelRunner, identity: ModelIdentity,
                 tokenizer_fp: str, context: ChunkContext,
                 encode: Callable[[str], list[int]] | None,
                 device_tier: DeviceTier | None = None) -> None:
        if context.fillers and encode is None:
            raise ValueError("an ingestion context with fillers needs a tokenizer to encode them")
        self.store = store
        self.runner = runner
        # hot entries in the model's device memory, looked up first (device_tier.py); shared
        # by every namespace view of the engine: stored names keep namespaces apart
        self.device_tier = device_tier if device_tier is not None and device_tier.max_bytes \
            else None
        self.identity = identity
        self.tokenizer_fp = tokenizer_fp
        self.context = context
        self._encode = encode
        self._filler_ids = {context: [encode(f) for f in context.fillers] if encode else []}
        self.backfill = Backfill()  # one worker per engine: its namespace views share it
        self._warned_long = [False]  # shared by the request copies (``with_store``)
        self._home = self  # the engine's own cache, which a request copy is made from
        # a request's copy: the weights' fingerprint taken once, at its start (reading it
        # checks every weight for a change: 291 tensors at a 7B model's shape, for each of a
        # request's keys, three per chunk); None: checked at every key
        self._model_fp: str | None = None

    # ---- keys and lookups ----------------------------------------------------------------

    def key(self, chunk_prefix_ids: Ids, chunk_ids: Ids,
            context: ChunkContext | None = None) -> str:
        """Store key of ``chunk_ids`` computed after ``chunk_prefix_ids`` in ``context`` (default:
        the one it is stored in, ``context_for``; a prefix is keyed as a chunk after () with
        ``NO_CONTEXT``)."""
        if context is None:
            context = self.context_for(chunk_prefix_ids, chunk_ids)
        model_fp = self._model_fp or self.identity.fingerprint
        return chunk_key(model_fp, self.tokenizer_fp, chunk_prefix_ids, chunk_ids, context.tag)

    def context_for(self, chunk_prefix_ids: Ids, chunk_ids: Ids) -> ChunkContext:
        """The ingestion context a chunk is stored in: the cache's, unless the chunk does not
        fit the model's context after the chunk prefix and the longest filler; then none (its
        rows computed after the chunk prefix alone, which the request path and ingestion both
        use: said once in a warning)."""
        fillers = self._fillers(self.context)
        if not fillers:
            return self.context
        room = self.runner.max_positions - len(chunk_prefix_ids) - max(map(len, fillers))
        if len(chunk_ids) <= room:
            return self.context
        if not self._warned_long[0]:
            self._warned_long[0] = True
            log.warning("a chunk of %d tokens does not fit the model's context of %d positions "
                        "after its chunk prefix and the ingestion context's fillers: such chunks "
                        "are computed after the chunk prefix alone (no context)", len(chunk_ids),
                        self.runner.max_positions)
        return NO_CONTEXT

    def open(self, chunk_prefix_ids: Ids, chunk_ids: Ids, context: ChunkContext,
             skip: Collection[str] = frozenset(),
             opened: list[LayeredEntry] | None = None) -> LayeredEntry | None:
        """The stored entry of the chunk opened for layer-wise reads, its header checked against
        the request; None for a miss, a key in ``skip`` or a foreign entry. The caller closes it
        (``opened`` collects it for that, whatever its header)."""
        key = self.key(chunk_prefix_ids, chunk_ids, context)
        if key in skip:
            return None
        entry = self._on_device(key)
        if entry is None:
            entry = self.store.open_layers(key)
        if entry is None:
            return None
        if opened is not None:
            opened.append(entry)
        if self._matches(entry, chunk_prefix_ids, chunk_ids, context):
            return entry
        if opened is None:
            entry.close()
        return None

    def _on_device(self, key: str) -> LayeredEntry | None:
        """The device tier's copy of ``key`` in this store's namespace, if it holds one."""
        if self.device_tier is None:
            return None
        return self.device_tier.get(self._device_name(key))

    def _device_name(self, key: str) -> str:
        """``key`` in the device tier: under this store's namespace id (a keyed hash of the
        tenant with store keys), so that namespaces never share a row there either."""
        return f"{self.store.namespace_id}\0{key}"

    def keep_on_device(self, entry: LayeredEntry) -> None:
        """After a request: an entry it read through from the store goes to the device tier
        (``DeviceTier.promote`` keeps only complete, verified store entries)."""
        if self.device_tier is not None and entry.key:
            self.device_tier.promote(self._device_name(entry.key), entry)

    def _matches(self, entry: LayeredEntry, chunk_prefix_ids: Ids, chunk_ids: Ids,
                 context: ChunkContext) -> bool:
        """Whether a stored entry is the one asked for (else a collision or a foreign entry: a
        logged miss)."""
        a = self.runner.adapter
        expected = (a.num_layers, a.num_kv_heads, len(chunk_ids), a.head_dim)
        prefix_hash = hash_ids(chunk_prefix_ids) if chunk_prefix_ids else ""
        if (entry.token_ids != tuple(chunk_ids) or entry.prefix_hash != prefix_hash
                or entry.context_tag != context.tag or tuple(entry.shape) != expected
                or entry.dtype != self.runner.dtype):
            log.warning("store entry for %d tokens does not match the request (collision or "
                        "foreign entry); recomputing", len(chunk_ids))
            return False
        return True

    def kv(self, chunk_prefix_ids: Ids, chunk_ids: Ids,
           context: ChunkContext | None = None, exact: bool = False) -> ChunkKV:
        """The chunk's whole KV in ``context`` (default: the one it is stored in): read from
        the store, or computed and stored now (also when the stored entry fails to load: the
        store has counted it and dropped it when its bytes are bad). ``exact`` (a prefix):
        stored in the model's dtype, and an entry stored rounded is computed again."""
        if context is None:
            context = self.context_for(chunk_prefix_ids, chunk_ids)
        entry = self.open(chunk_prefix_ids, chunk_ids, context)
        if entry is not None and exact and not entry.exact:
            entry.close()
            entry = None
        if entry is not None:
            try:
                return entry.materialize()
            except LayerReadError as exc:  # the store has dealt with the entry: a miss
                log.warning("stored rows of %d tokens failed to load (%s); computing them "
                            "instead", len(chunk_ids), exc)
            finally:
                entry.close()
        return self.compute_and_put(self.prefix(chunk_prefix_ids), chunk_prefix_ids, chunk_ids,
                                     context, exact=exact)

    def prefix(self, prefix_ids: Ids) -> ChunkKV | None:
        """The whole KV of a prefix (None for an empty one), stored or computed now: what
        computing a chunk after it needs."""
        return self.kv((), prefix_ids, NO_CONTEXT, exact=True) if len(prefix_ids) else None

    # ---- computing -------------------------------------------------------------------------

    def compute_and_put(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Ids,
                        chunk_ids: Ids, context: ChunkContext, ram: bool = True,
                        exact: bool = False) -> ChunkKV:
        """The chunk computed (``compute_pair``) and stored (``_put``): a miss's KV."""
        kv, alone = self.compute_pair(chunk_prefix, chunk_prefix_ids, chunk_ids, context)
        self._put(chunk_prefix_ids, chunk_ids, context, kv, alone, ram, exact)
        return kv

    def _put(self, chunk_prefix_ids: Ids, chunk_ids: Ids, context: ChunkContext, kv: ChunkKV,
             alone: ChunkKV | None, ram: bool = True, exact: bool = False) -> None:
        """Store a computed chunk: ``kv`` under its context's key and, when the context keeps it
        (``compute_pair``), the chunk computed ``alone`` under the no-context key. ``exact``
        (prefixes): in the model's dtype whatever the store's format, so a chunk computed after
        a stored prefix equals one computed after a fresh one (else the entries a job stores
        would depend on where its batches start)."""
        key = self.key(chunk_prefix_ids, chunk_ids, context)
        self.store.put(key, kv, ram=ram, exact=exact)
        if alone is not None:
            self.store.put(self.key(chunk_prefix_ids, chunk_ids, NO_CONTEXT), alone, ram=ram)
        if ram:  # a request's miss: hot, on the device now
            self._on_device_now(key, kv)

    def replace(self, key: str, kv: ChunkKV) -> None:
        """Store ``kv`` over the entry ``key`` (its rows with a profile measured now), in the
        store's tiers and on the device."""
        self.store.put(key, kv)
        self._on_device_now(key, kv)

    def _on_device_now(self, key: str, kv: ChunkKV) -> None:
        """``kv`` in the device tier as ``key``, over a copy it may hold (rows the store has
        just replaced: a profile added, exact rows over rounded ones); none without a tier."""
        tier = self.device_tier
        if tier is not None:
            name = self._device_name(key)
            tier.discard(name)
            tier.put(name, kv)

    def compute_pair(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Ids, chunk_ids: Ids,
                     context: ChunkContext) -> tuple[ChunkKV, ChunkKV | None]:
        """The chunk's KV in ``context`` (after the chunk prefix, whose KV is
        ``chunk_prefix``) and, when the context stores it too (``exact_first``), the chunk
        computed alone (else None): what a miss stores, computed now and not stored."""
        alone = self.runner.compute_chunk(chunk_prefix, chunk_prefix_ids, chunk_ids)
        if not context.fillers:
            return alone, None
        fillers = [(ids, self._filler_prefix(chunk_prefix_ids, ids))
                   for ids in self._fillers(context)]
        kv = in_context(self.runner, alone, chunk_prefix_ids, fillers, context.tag)
        return kv, alone if context.stores_alone else None

    def _fillers(self, context: ChunkContext) -> list[list[int]]:
        """The ids of ``context``'s fillers (encoded once)."""
        if context not in self._filler_ids:
            if self._encode is None:
                raise ValueError("an ingestion context with fillers needs a tokenizer")
            self._filler_ids[context] = [self._encode(f) for f in context.fillers]
        return self._filler_ids[context]

    def _filler_prefix(self, chunk_prefix_ids: Ids, filler_ids: Ids) -> ChunkKV:
        """The KV of the chunk prefix and a filler, cached like any prefix."""
        kv = self.prefix([*chunk_prefix_ids, *filler_ids])
        if kv is None:  # a filler is never empty (ChunkContext refuses one)
            raise ValueError("an empty filler has no KV")
        return kv

    def precompute(self, chunk_prefix_ids: Ids, chunks: Sequence[Ids], *,
                   profile: bool | int = False,
                   on_chunk: Callable[[int, bool], None] | None = None) -> list[bool]:
        """See ``BlendEngine.precompute``."""
        depth = profile_depth(profile)
        empty = [i for i, ids in enumerate(chunks) if not len(ids)]
        if empty:
            raise ValueError(f"chunks {empty[:5]} have no tokens: an empty chunk has no KV to "
                             "precompute")
        chunk_prefix = self.prefix(chunk_prefix_ids)
        keys = [self.key(chunk_prefix_ids, ids) for ids in chunks]
        todo = set(self.store.missing(keys))
        computed = []
        for i, (key, ids) in enumerate(zip(keys, chunks)):
            now = key in todo
            if now:
                todo.discard(key)  # a chunk listed twice is computed once
                context = self.context_for(chunk_prefix_ids, ids)
                kv, alone = self.compute_pair(chunk_prefix, chunk_prefix_ids, ids, context)
                probes = neighbours(chunks, i, depth)
                if probes:
                    kv = profiled(self.runner, kv, chunk_prefix_ids, probes, chunk_prefix)
                self._put(chunk_prefix_ids, ids, context, kv, alone, ram=False)
            computed.append(now)
            if on_chunk is not None:
                on_chunk(i, now)
        return computed

    # ---- a request's rows ------------------------------------------------------------------

    def rows_for(self, layout: PromptLayout, config: BlendConfig,
                 failed: dict[str, ChunkKV | None] | None = None, head: int = 0,
                 history: HistoryRows | None = None) -> RequestRows:
        """The cached rows of a request: stored entries opened for layer-wise reads (their
        layers are read by the loop's feed), chunks missing from the store computed and stored
        now. ``failed``: keys whose entry failed to load in an earlier attempt, never opened
        again, with the KV computed for each (filled in here: a chunk is computed once whatever
        the attempts). ``head``: rows [0, head) are in the request's KV already (the prefix
        cache's, at a chunk boundary): the prefix and the chunks before it get no row here.
        ``history``: the chunk of an earlier turn's rows (engine/caches/history.py), taken as they
        are:
        not looked up, not stored."""
        rows = RequestRows(promote=self.keep_on_device if self.device_tier is not None else None)
        if config.mode == "full":
            return rows
        try:
            fill(self, rows, layout, config, {} if failed is None else failed, head, history)
        except BaseException:
            rows.close()
            raise
        return rows

    def miss_passes(self, layout: PromptLayout, config: BlendConfig,
                    history: HistoryRows | None = None) -> list[int]:
        """The prompt length of each pass that computing what the store does not hold of the
        request (its prefix, its chunks) takes before ``rows_for`` returns: a chunk after the
        ids it is computed after, and once more after each filler of its context. Looks keys
        up; loads nothing. ``history``: as for ``rows_for`` (never computed)."""
        passes = []
        for piece in self.absent(layout, config, history):
            n = len(piece.chunk_prefix_ids) + len(piece.ids)
            passes += [n] + [n + len(f) for f in self._fillers(piece.context)]
        return passes

    def absent(self, layout: PromptLayout, config: BlendConfig,
               history: HistoryRows | None = None) -> list[Piece]:
        """The request's prefix and chunks that no store holds (what ``rows_for`` would compute
        first), prefix first; looks keys up, loads nothing. ``history``: as for ``rows_for``."""
        if config.mode == "full":
            return []
        pieces = [Piece((), tuple(layout.prefix_ids), NO_CONTEXT,
                        self.key((), layout.prefix_ids, NO_CONTEXT), exact=True,
                        prefix=True)
                  ] if layout.prefix_ids else []
        pieces += [Piece(tuple(p), tuple(ids), context, self.key(p, ids, context),
                         exact=config.mode == "prefix")  # as ``request_rows.fill`` stores it
                   for _, span, p, ids, context, _ in request_chunks(self, layout, config)
                   if history is None or span[0] != history.start]
        missing = set(self.store.missing([piece.key for piece in pieces]))
        return [piece for piece in pieces if piece.key in missing]

    def backfill_later(self, pieces: Sequence[Piece]) -> int:
        """Compute and store ``pieces`` off the request's path (``backfill.py``), into the
        store this cache was made over (not a request's view of it); how many were queued."""
        return self.backfill.submit(self._home, pieces)

    def with_store(self, store: KVStore, home: bool = False) -> ChunkCache:
        """This cache over ``store``, sharing everything else (the device tier, the backfill,
        the warnings said once): a request's own view of the same storage (its stats count
        its own calls), or with ``home`` a store of its own (a namespace's view), where its
        backfilled pieces go."""
        clone = copy.copy(self)
        clone.store = store
        if home:
            clone._home, clone._model_fp = clone, None
        else:  # one request: one set of weights, checked once
            clone._model_fp = self.identity.fingerprint
        return clone
