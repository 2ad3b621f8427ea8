"""BlendKVTransform: precompute node KVs inside a LlamaIndex ``IngestionPipeline``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode, TransformComponent

from blendrag.config import profile_depth
from blendrag.llamaindex.llm import BlendLLM


class BlendKVTransform(TransformComponent):
    """Stores the KV of every node's exact prompt text (``MetadataMode.LLM`` content in the
    LLM's chunk template), and of the chunk separator, in the engine's store, records the text
    for flat-prompt detection, and returns the nodes unchanged.

    Put it after the splitter (it must see the final node texts). The pipeline's
    ``IngestionCache`` skips the transform on a re-run with the same nodes, and its cache key
    includes ``kv_identity`` (model, tokenizer, chunk prefix, chunk template and separator: a
    different model runs the transform again) and ``persistence``: where the KVs and the
    recorded texts live. That is the same string in a new process only when both survive a
    restart (a disk or Redis KV tier and a persisted text index, which is the default with a
    disk tier); otherwise the transform runs again, so a cache hit never leaves the LLM
    without the texts (and KVs) it needs.

    ``profile``: also store each new node's context-sensitivity profile, for an LLM blending
    with ``BlendConfig(selector="profile")``; one more forward per node. Each node is measured
    after the node before it in the pipeline (the splitter's document order; the first node of
    a run after the last). Part of the cache key too.
    """

    kv_identity: str = Field(description="What node KVs depend on besides the node text.")
    persistence: str = Field(description="Where the KVs and texts go; the same in a new process "
                             "only when both survive it.")
    profile: bool | int = Field(default=False,
                                description="Also store each node's context-sensitivity profile "
                                "(an int: measured after each of that many preceding nodes).")
    _llm: BlendLLM = PrivateAttr()

    def __init__(self, llm: BlendLLM, *, profile: bool | int = False, **kwargs: Any) -> None:
        profile_depth(profile)  # refuse a bad value at construction
        super().__init__(kv_identity=llm.client.kv_identity, profile=profile,
                         persistence=llm.client.persistence, **kwargs)
        self._llm = llm

    @classmethod
    def class_name(cls) -> str:
        return "BlendKVTransform"

    @property
    def llm(self) -> BlendLLM:
        """The LLM whose engine stores the KVs."""
        return self._llm

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """Precompute the nodes' KVs (in the order given: each node's profile, when asked for,
        is measured after the node before it; the first after the last) and record their
        texts; return the nodes as they are."""
        texts = [self._llm.chunk_text(n) for n in nodes]
        self._llm.client.ingest(texts, profile=self.profile, progress=False)
        return nodes
