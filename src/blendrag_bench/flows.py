"""How an evaluation lays out each item's prompt and stores its chunk KVs: a *flow*
(``blendrag.calibration.flows``: what LangChain's and LlamaIndex's ``BlendLLM`` run, and what a
``BlendEngine`` user runs), and ``BenchFlow``, the quality benchmark's own set-up
(``build_prompt``, chunk ids precomputed in prompt or shuffled order, profiles after k
neighbours). Every flow computes chunks in the engine's ingestion context.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from blendrag.calibration.flows import (
    FLOWS,
    EngineFlow,
    Flow,
    IntegrationFlow,
    context_words,
    make_flow,
    prefix_words,
)
from blendrag.engine.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag_bench.datasets import EvalItem

if TYPE_CHECKING:
    from blendrag_bench.quality_config import QualityConfig

__all__ = ["FLOWS", "BenchFlow", "EngineFlow", "Flow", "IntegrationFlow", "context_words",
           "make_flow"]


class BenchFlow:
    """``blendrag bench quality``'s set-up: ``engine.build_prompt``; chunk ids precomputed in
    ``config.ingest_order``, with profiles after ``config.profile_neighbours`` neighbours
    when the profile selector is evaluated."""

    def __init__(self, engine: BlendEngine, config: QualityConfig) -> None:
        self.engine, self.config = engine, config

    def layout(self, item: EvalItem) -> PromptLayout:
        return self.engine.build_prompt(item.prefix, item.chunks, item.suffix)

    def ingest(self, index: int, item: EvalItem, layout: PromptLayout) -> None:
        config = self.config
        chunks = list(layout.chunk_ids)
        if config.ingest_order == "shuffled":
            random.Random(config.seed * 1_000_003 + index).shuffle(chunks)
        profile = "blend" in config.modes and "profile" in config.selectors
        self.engine.precompute(layout.chunk_prefix_ids, chunks,
                               profile=config.profile_neighbours if profile else 0)

    def describe(self) -> str:
        return (f"prefix + chunks + suffix as given, chunk KVs computed "
                f"{prefix_words(self.engine)}; {context_words(self.engine)}")
