"""BlendKVTransform: precompute node KVs inside a LlamaIndex ``IngestionPipeline``, in this
process or in worker processes (``num_workers=N``, ``RayIngestionPipeline``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode, TransformComponent

from blendrag.config import profile_depth
from blendrag.distributed.settings import IngestSettings, shared_engine
from blendrag.integration.chunks import DEFAULT_CHUNK_TEMPLATE, DEFAULT_SEPARATOR, ChunkFormat
from blendrag.integration.ingestion_key import KVIdentity, spec_persistence
from blendrag.llamaindex.llm import BlendLLM

log = logging.getLogger(__name__)

_DETACHED = ("BlendKVTransform(llm) was copied into another process (IngestionPipeline("
             "num_workers=N), Ray), where its LLM cannot follow (a model and a store do not "
             "pickle). Build it from settings instead, so that each worker builds its own: "
             "BlendKVTransform(settings=IngestSettings(model=..., store=StoreConfig(...)))")


class BlendKVTransform(TransformComponent):
    """Stores the KV of every node's exact prompt text (``MetadataMode.LLM`` content in the
    LLM's chunk template), and of the chunk separator, in the engine's store, records the text
    for flat-prompt detection, and returns the nodes unchanged.

    Two ways to build it: ``BlendKVTransform(llm)`` runs on that LLM, in this process only.
    ``BlendKVTransform(settings=IngestSettings(...), chunk_template=..., chunk_separator=...)``
    builds its LLM from plain settings wherever it runs, once per process: pickled into
    ``IngestionPipeline(num_workers=N)``'s workers, or made in Ray actors by
    ``RayTransformComponent(transform_class=BlendKVTransform, transform_kwargs={"settings":
    ...})``. The settings' store must be one every worker and the querying LLM reach (a folder
    on one machine, Redis across machines); the texts are recorded in ``settings.text_index``,
    else in ``<store folder>/text_index`` (where ``BlendLLM`` looks by default), else nowhere
    that outlives the worker (then query with ``blend_query_engine``, which passes the nodes).

    Put it after the splitter (it must see the final node texts). The pipeline's
    ``IngestionCache`` skips the transform on a re-run with the same nodes, and its cache key
    includes ``kv_identity`` (model, tokenizer, chunk prefix, chunk template and separator: a
    different model runs the transform again; built from settings: the model as named) and
    ``persistence``: where the KVs and the recorded texts live. That is the same string in a
    new process only when both survive a restart (a disk or Redis KV tier and a persisted text
    index); otherwise the transform runs again, so a cache hit never leaves the LLM without the
    texts (and KVs) it needs.

    ``profile``: also store each new node's context-sensitivity profile, for an LLM blending
    with ``BlendConfig(selector="profile")``; one more forward per node. Each node is measured
    after the node before it in the pipeline (the splitter's document order; the first node of
    a run after the last; in a worker, within the nodes it was given). Part of the cache key.
    """

    kv_identity: str = Field(description="What node KVs depend on besides the node text.")
    persistence: str = Field(description="Where the KVs and texts go; the same in a new process "
                             "only when both survive it.")
    profile: bool | int = Field(default=False,
                                description="Also store each node's context-sensitivity profile "
                                "(an int: measured after each of that many preceding nodes).")
    settings: IngestSettings | None = Field(
        default=None, description="How a worker process builds the LLM (None: built on an LLM, "
                                  "which runs in this process only).")
    chunk_template: str = Field(default=DEFAULT_CHUNK_TEMPLATE,
                                description="A node's prompt text; must contain {text}.")
    chunk_separator: str = Field(default=DEFAULT_SEPARATOR,
                                 description="What goes between two chunks of a prompt.")
    _llm: BlendLLM | None = PrivateAttr(default=None)

    def __init__(self, llm: BlendLLM | None = None, *, settings: IngestSettings | None = None,
                 profile: bool | int = False, **kwargs: Any) -> None:
        profile_depth(profile)  # refuse a bad value at construction
        if llm is not None and settings is not None:
            raise ValueError("BlendKVTransform takes an llm or settings, not both")
        if llm is not None and not isinstance(llm, BlendLLM):
            raise TypeError(f"BlendKVTransform takes blendrag's LlamaIndex BlendLLM "
                            f"(blendrag.llamaindex), got {type(llm).__module__}."
                            f"{type(llm).__name__}")
        if llm is not None:
            super().__init__(kv_identity=llm.client.kv_identity, profile=profile,
                             persistence=llm.client.persistence,
                             chunk_template=llm.chunk_template,
                             chunk_separator=llm.chunk_separator, **kwargs)
            self._llm = llm
        elif settings is not None:
            _check_settings(settings)
            fmt = (kwargs.get("chunk_template", DEFAULT_CHUNK_TEMPLATE),
                   kwargs.get("chunk_separator", DEFAULT_SEPARATOR))
            kwargs.setdefault("kv_identity", KVIdentity.of_spec(settings).key(ChunkFormat(*fmt)))
            kwargs.setdefault("persistence", spec_persistence(settings, settings.text_index))
            super().__init__(settings=settings, profile=profile, **kwargs)
        elif "kv_identity" in kwargs:  # unpickled in a worker: its LLM stayed behind
            super().__init__(profile=profile, **kwargs)
        else:
            raise ValueError("BlendKVTransform needs a BlendLLM, or settings=IngestSettings(...) "
                             "to run in worker processes")

    @classmethod
    def class_name(cls) -> str:
        return "BlendKVTransform"

    @property
    def llm(self) -> BlendLLM:
        """The LLM whose engine stores the KVs (built from the settings on first use, once per
        process)."""
        llm = getattr(self, "_llm", None)  # a copy made without __init__ may lack it
        if llm is None:
            if self.settings is None:
                raise RuntimeError(_DETACHED)
            llm = self._llm = _worker_llm(self.settings, self.chunk_template,
                                          self.chunk_separator)
        return llm

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """Precompute the nodes' KVs (in the order given: each node's profile, when asked for,
        is measured after the node before it; the first after the last) and record their
        texts; return the nodes as they are."""
        if not nodes:  # an index over no documents: say so now, not at every query
            log.warning("BlendKVTransform got no nodes: nothing to ingest. Either the reader "
                        "loaded no document (an index over none retrieves no passage: every "
                        "query is a plain full prefill), or an IngestionPipeline's docstore "
                        "skipped documents an earlier run ingested: their KVs and texts are "
                        "where that run kept them, which a new process finds only in a "
                        "persistent store (a TieredKVStore with a disk tier keeps the text "
                        "index beside the KVs); with the in-memory default, build the index "
                        "again without the docstore")
            return nodes
        llm = self.llm
        texts = [llm.chunk_text(n) for n in nodes]
        llm.client.ingest(texts, profile=self.profile, progress=False)
        return nodes


def _check_settings(settings: IngestSettings) -> None:
    if not isinstance(settings, IngestSettings):
        raise ValueError(f"settings must be an IngestSettings, got {type(settings).__name__}")
    if settings.chunk_prefix is None:
        raise ValueError("BlendKVTransform's settings need a chunk_prefix (e.g. ''): node KVs "
                         "are computed before any prompt exists")


_LOCK = threading.Lock()
_LLMS: dict[tuple[str, str, str], BlendLLM] = {}


def _worker_llm(settings: IngestSettings, template: str, separator: str) -> BlendLLM:
    """This process's LLM for the settings: every copy of the transform in a worker (one per
    batch in IngestionPipeline's workers) shares one model."""
    key = (repr(settings), template, separator)
    with _LOCK:
        if key not in _LLMS:
            engine, text_index = shared_engine(settings)
            _LLMS.clear()
            _LLMS[key] = BlendLLM(engine, text_index=text_index, chunk_template=template,
                                  chunk_separator=separator)
        return _LLMS[key]
